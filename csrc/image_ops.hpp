// Per-pixel arithmetic of the image tasks, shared by the host items and the CUDA kernels
// so that both backends compute the same thing.
#pragma once

#ifdef __CUDACC__
#define FR_HD __host__ __device__ __forceinline__
#else
#define FR_HD inline
#endif

namespace freeride::image {

// scipy.ndimage's "reflect" (half-sample symmetric): d c b a | a b c d | d c b a.
FR_HD long long reflect(long long i, long long n) {
  if (n == 1) return 0;
  const long long period = 2 * n;
  i %= period;
  if (i < 0) i += period;
  return i < n ? i : period - 1 - i;
}

FR_HD float load(const void* base, int dtype, unsigned long long idx) {
  return dtype == 0 ? static_cast<float>(static_cast<const unsigned char*>(base)[idx])
                    : static_cast<const float*>(base)[idx];
}

FR_HD void store(void* base, int dtype, unsigned long long idx, float v) {
  if (dtype == 0) {
    v = v < 0.f ? 0.f : (v > 255.f ? 255.f : v);
    static_cast<unsigned char*>(base)[idx] = static_cast<unsigned char>(v + 0.5f);
  } else {
    static_cast<float*>(base)[idx] = v;
  }
}

// Source coordinate and weights of bilinear interpolation with align_corners=False.
struct Tap {
  long long i0, i1;
  float w1;
};
FR_HD Tap bilinear_tap(long long dst, long long in, long long out) {
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  float src = (static_cast<float>(dst) + 0.5f) * scale - 0.5f;
  if (src < 0.f) src = 0.f;
  long long i0 = static_cast<long long>(src);
  if (i0 > in - 1) i0 = in - 1;
  const long long i1 = i0 + 1 < in ? i0 + 1 : in - 1;
  return {i0, i1, src - static_cast<float>(i0)};
}

}  // namespace freeride::image
