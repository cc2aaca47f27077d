// Error checks shared by the probes in bench/probes (each built alone by nvcc, see its header):
// die_unless prints what failed, its code and the line, then exits; CK wraps a CUDA runtime call.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

static void die_unless(bool ok, const char* what, int code, int line) {
  if (ok) return;
  std::printf("%s error %d at line %d\n", what, code, line);
  std::exit(1);
}
#define CK(x)                                                 \
  do {                                                        \
    const cudaError_t e_ = (x);                               \
    die_unless(e_ == cudaSuccess, "CUDA", int(e_), __LINE__); \
  } while (0)
