#pragma once
// Everything of the autograd layer: tensors, the engine, every op and gradcheck.

#include "autograd/activation.h"
#include "autograd/attention.h"
#include "autograd/checkpoint.h"
#include "autograd/cpu.h"
#include "autograd/dropout.h"
#include "autograd/elementwise.h"
#include "autograd/gradcheck.h"
#include "autograd/indexing.h"
#include "autograd/loss.h"
#include "autograd/matmul.h"
#include "autograd/norm.h"
#include "autograd/random.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "autograd/tensor.h"
