/* The HIP tests' check of a HIP call, on the shared test checks (../common/check.h). */
#pragma once

#include <hip/hip_runtime_api.h>

#include "../common/check.h"

/* @expr must return hipSuccess; otherwise report HIP's name for the error and return 1 (as REQUIRE does). */
#define REQUIRE_HIP(expr)                                                                                    \
        do {                                                                                                 \
                hipError_t check_e_ = (expr);                                                                \
                if (check_e_ != hipSuccess) {                                                                \
                        check_failed(__FILE__, __LINE__, "%s = %d (%s)", #expr, (int)check_e_,               \
                                     hipGetErrorString(check_e_));                                           \
                        return 1;                                                                            \
                }                                                                                            \
        } while (0)
