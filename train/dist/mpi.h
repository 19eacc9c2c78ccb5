#pragma once
// The MPI communicator (library attograd_mpi, built only when CMake finds MPI; ATTOGRAD_HAS_MPI is then defined for
// its users). An internal header: it names no MPI type, but only builds with MPI have its definitions.

#include <cstdint>
#include <memory>

#include "train/dist/communicator.h"

namespace attograd::dist {

/// Options of the MPI communicator.
struct MpiOptions {
  int64_t bucket_floats = 1 << 22;  ///< floats reduced per collective call (bounds the scratch memory): 16 MB
};

/// Initialises MPI (MPI_Init_thread, funneled) and returns MPI_COMM_WORLD as a Communicator; MPI is finalised when
/// the last reference goes. Error when MPI was initialised before by someone else.
std::shared_ptr<Communicator> mpi_world(const MpiOptions& options = {});

}  // namespace attograd::dist
