// attograd_bench, built with the examples (examples/CMakeLists.txt makes one executable per examples/*.cpp):
// bench/attograd_bench_main.cpp's main() and the `bench` command of the attograd tool, in one translation unit.
// bench/compare runs it. With ATTOGRAD_BUILD_EXAMPLES=OFF and ATTOGRAD_BUILD_BENCHMARKS=ON, bench/CMakeLists.txt
// builds the same executable from the two files directly.

#include "../bench/attograd_bench_main.cpp"
#include "cli/cli_bench.cpp"
