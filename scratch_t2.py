import subprocess
from runtime import cuda
stubs = ("#define __device__\n#define __global__\n#define __shared__\n"
         "#define __forceinline__ inline\n#define __noinline__\n"
         "struct rt_dim3 { unsigned x, y, z; };\n"
         "static rt_dim3 blockIdx, gridDim, threadIdx, blockDim;\n"
         "static inline int atomicCAS(int *p, int a, int b)"
         " { int o = *p; if (o == a) *p = b; return o; }\n"
         "static inline void __threadfence(void) {}\n"
         "static inline void __threadfence_block(void) {}\n"
         "static inline void __syncthreads(void) {}\n"
         "static inline long long __mul64hi(long long a, long long b)"
         " { return (long long)(((__int128)a * b) >> 64); }\n"
         "struct float4 { float x, y, z, w; }; struct double2 { double x, y; };\n"
         "template <class T> static inline T __shfl_xor_sync(unsigned m, T v, int l) { return v; }\n"
         "template <class T> static inline T __shfl_sync(unsigned m, T v, int l) { return v; }\n"
         "#define __align__(n)\n"
         "#include <cmath>\nusing std::sqrt; using std::copysign; using std::fabs;\n")
src = """
KERNEL void k(cap_t x, cap_t out, int64_t off, int64_t ld)
{
    float smem_a[16][33];
    double smem_d[64];
    cap_tile_load_f32(x, off, ld, 16, 32, smem_a, 0, 33);
    cap_tile_store_f32(out, 0, 32, 16, 32, smem_a, 0, 33);
    cap_tile_load_f64(x, 0, 8, 8, 8, smem_d, 0, 8);
    float v = smem_a[rt_thread_idx() % 16][0];
    v = rt_warp_sum_f32(v) + rt_shfl_xor_f32(v, 16);
    double w = rt_shfl_xor_f64(1.0, 1) + rt_warp_sum_f64(2.0);
    int64_t q = rt_shfl_xor_i64(rt_lane_idx(), 8);
    cap_store_f32(out, rt_thread_idx(), v + (float)w + (float)q);
}
"""
for checked in (True, False):
    text = cuda.translate(src, checked=checked).text
    open("/tmp/k.cpp", "w").write(stubs + text)
    r = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-w", "/tmp/k.cpp"], capture_output=True, text=True)
    print(checked, r.returncode, r.stderr[:3000])
print(text[text.index("__rtk_k("):][:1500])
