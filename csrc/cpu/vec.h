// Selects this translation unit's vector layer. Exactly one OCTAVO_ISA_* macro is defined by
// the build (setup.py / tests/csrc/build.sh), together with OCTAVO_ISA_NS (the namespace).
#pragma once
#if defined(OCTAVO_ISA_AVX512)
#include "vec_avx512.h"
#elif defined(OCTAVO_ISA_AVX2)
#include "vec_avx2.h"
#elif defined(OCTAVO_ISA_NEON)
#include "vec_neon.h"
#elif defined(OCTAVO_ISA_SCALAR)
#include "vec_scalar.h"
#else
#error "define one of OCTAVO_ISA_AVX512, OCTAVO_ISA_AVX2, OCTAVO_ISA_NEON, OCTAVO_ISA_SCALAR"
#endif
