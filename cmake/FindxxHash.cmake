# Finds Debian's libxxhash (package libxxhash-dev), which ships no CMake config: the header xxhash.h and the
# library xxhash. Defines xxHash_FOUND, xxHash_INCLUDE_DIR, xxHash_LIBRARY and the imported target xxHash::xxHash.
# Installed next to attogradConfig.cmake, so that a consumer of the static library finds the same dependency.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(PC_xxHash QUIET libxxhash)
endif()
find_path(xxHash_INCLUDE_DIR NAMES xxhash.h HINTS ${PC_xxHash_INCLUDE_DIRS})
find_library(xxHash_LIBRARY NAMES xxhash HINTS ${PC_xxHash_LIBRARY_DIRS})

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(xxHash REQUIRED_VARS xxHash_LIBRARY xxHash_INCLUDE_DIR)
mark_as_advanced(xxHash_INCLUDE_DIR xxHash_LIBRARY)

if(xxHash_FOUND AND NOT TARGET xxHash::xxHash)
  add_library(xxHash::xxHash UNKNOWN IMPORTED)
  set_target_properties(xxHash::xxHash PROPERTIES
    IMPORTED_LOCATION "${xxHash_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${xxHash_INCLUDE_DIR}")
endif()
