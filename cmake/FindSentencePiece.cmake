# Finds Debian's libsentencepiece-dev (package libsentencepiece-dev), which ships a pkg-config file but no CMake
# config: defines SentencePiece_FOUND and the imported target PkgConfig::SentencePiece (sentencepiece and
# sentencepiece_train, the subword tokenizer of train/data/tokenizer.cpp). Installed next to attogradConfig.cmake,
# so that a consumer of the static library finds the same dependency.
find_package(PkgConfig REQUIRED)
if(NOT TARGET PkgConfig::SentencePiece)
  pkg_check_modules(SentencePiece QUIET IMPORTED_TARGET sentencepiece)
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(SentencePiece REQUIRED_VARS SentencePiece_LINK_LIBRARIES)
