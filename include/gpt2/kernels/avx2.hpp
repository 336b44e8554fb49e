// PLACEHOLDER until the avx2 level is merged: this build has no avx2 kernels.
#pragma once
#define GPT2_KERNELS_HAVE_AVX2 0
