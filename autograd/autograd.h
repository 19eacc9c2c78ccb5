#pragma once
// Everything of the autograd layer: tensors, the engine, every op and gradcheck.

#include "autograd/elementwise.h"
#include "autograd/gradcheck.h"
#include "autograd/random.h"
#include "autograd/tensor.h"
