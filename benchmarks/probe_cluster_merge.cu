// The split merge at the end of mma-attn's main loop, priced three ways on a Hopper GPU, before
// anyone writes the loop as a cluster (docs/kernels/mma_attn.md, "What would meet the targets",
// item 1). Two splits a request, 64 heads of 512, as the warp-specialised loops run at B = 53 to
// 88 on 132 SMs. Each split's CTA (256 threads, as the loops' consumer partition) starts with its
// split's o [64, 512] fp32 in registers (128 values a thread) and its lse [64] (base 2); values
// are integer hashes, exact in fp32, so the host recomputes them for the float64 reference.
//
//   combine  what runs today: each split writes bf16 partials and lse, then a second kernel (one
//            block per request and head) merges the two with the sink;
//   cluster  the two splits of a request as a cluster of two CTAs: each sends the half of the
//            columns the other merges (64 KiB fp32) and its lse into the other's shared memory,
//            one cluster barrier, then each merges its half and writes it;
//   cluster-bf16  the same, sending that half in bf16 (32 KiB), as today's partials are;
//   store    each CTA writes its half of o, no exchange, no merge: the floor under `cluster`.
//
// Build and run on the GPU machine (nvcc 13.0 there):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a benchmarks/probe_cluster_merge.cu -o /tmp/pcm && /tmp/pcm
// Prints, per B, each variant's CUDA-graph time per call (median of 30 replays of 20 calls) and
// the float64 check of the three merges (max |o - ref| over max |ref|, lse the same; an
// unwritten NaN counts as infinite), before and after the replays; exits 1 if a check fails.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cg = cooperative_groups;

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t err_ = (x);                                                               \
    if (err_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_));  \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

constexpr int H = 64, D = 512, HALF = D / 2, THREADS = 256, PER_THREAD = H * D / THREADS;
constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

// split s of request b: element e = h * D + d of o (unnormalised values do not matter here)
__host__ __device__ inline float o_val(int b, int s, int e) {
  unsigned x = unsigned(e) * 2654435761u + unsigned(s) * 40503u + unsigned(b) * 97u;
  return float((x >> 20) & 1023u) / 512.0f - 1.0f;
}
__host__ __device__ inline float lse_val(int b, int s, int h) { return float((h * 7 + s * 13 + b * 3) % 17) * 0.25f - 2.0f; }
__host__ __device__ inline float sink_val(int h) { return float(h % 5) * 0.3f - 0.6f; }  // natural log

// thread t holds columns 4v .. 4v + 3 of both halves (v = t % 64) in rows g, g + 4, .., g + 60
// (g = t / 64): acc[(rr * 2 + half) * 4 + k] is row g + 4 rr, column half * 256 + 4v + k. A warp
// writes 256 contiguous bytes of a row in bf16 (8 a thread), 512 in fp32; the values are pinned in
// registers (an empty asm), as a loop's accumulator would be, so none is recomputed at its use.
constexpr int ROWS_PER_THREAD = H / 4;
__device__ inline int row_of(int rr) { return threadIdx.x / 64 + 4 * rr; }
__device__ inline int col_of(int half) { return half * HALF + 4 * (threadIdx.x % 64); }

__device__ inline void load_acc(float (&acc)[PER_THREAD], int b, int s) {
#pragma unroll
  for (int rr = 0; rr < ROWS_PER_THREAD; ++rr)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float& a = acc[(rr * 2 + half) * 4 + k];
        a = o_val(b, s, row_of(rr) * D + col_of(half) + k);
        asm volatile("" : "+f"(a));
      }
}

// row rr's four values in column half `half` (a run-time 0 or 1): selects, so acc stays in registers
__device__ inline float4 half_of(const float (&acc)[PER_THREAD], int rr, int half) {
  const float* lo = &acc[(rr * 2) * 4];
  const float* hi = &acc[(rr * 2 + 1) * 4];
  return half ? make_float4(hi[0], hi[1], hi[2], hi[3]) : make_float4(lo[0], lo[1], lo[2], lo[3]);
}

__device__ inline void store4(__nv_bfloat16* p, float4 v) {
  __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), c = __floats2bfloat162_rn(v.z, v.w);
  uint2 packed = make_uint2(*reinterpret_cast<unsigned*>(&a), *reinterpret_cast<unsigned*>(&c));
  *reinterpret_cast<uint2*>(p) = packed;  // 8 bytes
}

__global__ void __launch_bounds__(THREADS, 1) write_partials(__nv_bfloat16* o_part, float* lse_part) {
  const int b = blockIdx.x / 2, s = blockIdx.x % 2, t = threadIdx.x;
  float acc[PER_THREAD];
  load_acc(acc, b, s);
  __nv_bfloat16* out = o_part + size_t(b * 2 + s) * H * D;
#pragma unroll
  for (int rr = 0; rr < ROWS_PER_THREAD; ++rr)
#pragma unroll
    for (int half = 0; half < 2; ++half) store4(out + row_of(rr) * D + col_of(half), half_of(acc, rr, half));
  if (t < H) lse_part[(b * 2 + s) * H + t] = lse_val(b, s, t);
}

// one block per (request, head), 128 threads of four columns: the shape of kernel.py's combine
__global__ void __launch_bounds__(128) combine(const __nv_bfloat16* o_part, const float* lse_part, const float* sink,
                                               __nv_bfloat16* o, float* lse) {
  const int b = blockIdx.x, h = blockIdx.y, t = threadIdx.x;
  const float l0 = lse_part[(b * 2) * H + h], l1 = lse_part[(b * 2 + 1) * H + h], sk = sink[h] * LOG2E;
  const float top = fmaxf(fmaxf(l0, l1), sk);
  const float w0 = exp2f(l0 - top), w1 = exp2f(l1 - top), den = w0 + w1 + exp2f(sk - top);
  const __nv_bfloat162* p0 = reinterpret_cast<const __nv_bfloat162*>(o_part + (size_t(b * 2) * H + h) * D) + t * 2;
  const __nv_bfloat162* p1 = reinterpret_cast<const __nv_bfloat162*>(o_part + (size_t(b * 2 + 1) * H + h) * D) + t * 2;
  __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(o + (size_t(b) * H + h) * D) + t * 2;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float2 a = __bfloat1622float2(p0[k]), c = __bfloat1622float2(p1[k]);
    out[k] = __floats2bfloat162_rn((w0 * a.x + w1 * c.x) / den, (w0 * a.y + w1 * c.y) / den);
  }
  if (t == 0) lse[b * H + h] = (top + log2f(den)) * LN2;
}

// shared memory: the half received [H, HALF] (fp32, or bf16 in the first half of that), the
// peer's lse [H], own lse [H], weights 2 x [H]
constexpr int RECV = H * HALF, SMEM_FLOATS = RECV + 4 * H;

__device__ inline void send4(float* peer, int at, float4 v) { *reinterpret_cast<float4*>(peer + at) = v; }
__device__ inline void send4(__nv_bfloat16* peer, int at, float4 v) { store4(peer + at, v); }  // 8 bytes
__device__ inline float4 recv4(const float* smem, int at) { return *reinterpret_cast<const float4*>(smem + at); }
__device__ inline float4 recv4(const __nv_bfloat16* smem, int at) {
  const uint2 packed = *reinterpret_cast<const uint2*>(smem + at);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.x));
  const float2 c = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.y));
  return make_float4(a.x, a.y, c.x, c.y);
}

template <typename Wire>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(THREADS, 1)
    cluster_merge(const float* sink, __nv_bfloat16* o, float* lse) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  Wire* recv = reinterpret_cast<Wire*>(smem);
  cg::cluster_group cluster = cg::this_cluster();
  const int s = int(cluster.block_rank()), b = blockIdx.x / 2, t = threadIdx.x;
  // the peer must have started before its shared memory is written: arrive now, wait at the
  // first remote store, so the wait overlaps the accumulator's set-up
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  float acc[PER_THREAD];
  load_acc(acc, b, s);
  float* peer = cluster.map_shared_rank(smem, s ^ 1);
  Wire* peer_recv = reinterpret_cast<Wire*>(peer);
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
#pragma unroll
  for (int rr = 0; rr < ROWS_PER_THREAD; ++rr)  // the half the peer merges, 16 (fp32) or 8 (bf16) bytes a store
    send4(peer_recv, row_of(rr) * HALF + 4 * (t % 64), half_of(acc, rr, s ^ 1));
  if (t < H) {
    const float l = lse_val(b, s, t);
    peer[RECV + t] = l;
    smem[RECV + H + t] = l;
  }
  cluster.sync();  // release of the stores into the peer, acquire of the peer's into this CTA
  if (t < H) {
    const float lp = smem[RECV + t], lo = smem[RECV + H + t], sk = sink[t] * LOG2E;
    const float top = fmaxf(fmaxf(lo, lp), sk);
    const float wo = exp2f(lo - top), wp = exp2f(lp - top), den = wo + wp + exp2f(sk - top);
    smem[RECV + 2 * H + t] = wo / den;
    smem[RECV + 3 * H + t] = wp / den;
    if (s == 0) lse[b * H + t] = (top + log2f(den)) * LN2;
  }
  __syncthreads();
  __nv_bfloat16* out = o + size_t(b) * H * D;
#pragma unroll
  for (int rr = 0; rr < ROWS_PER_THREAD; ++rr) {
    const int r = row_of(rr);
    const float wo = smem[RECV + 2 * H + r], wp = smem[RECV + 3 * H + r];
    const float4 a = half_of(acc, rr, s), c = recv4(recv, r * HALF + 4 * (t % 64));
    store4(out + r * D + col_of(s),
           make_float4(a.x * wo + c.x * wp, a.y * wo + c.y * wp, a.z * wo + c.z * wp, a.w * wo + c.w * wp));
  }
}

__global__ void __launch_bounds__(THREADS, 1) store_half(__nv_bfloat16* o) {
  const int b = blockIdx.x / 2, s = blockIdx.x % 2;
  float acc[PER_THREAD];
  load_acc(acc, b, s);
  __nv_bfloat16* out = o + size_t(b) * H * D;
#pragma unroll
  for (int rr = 0; rr < ROWS_PER_THREAD; ++rr) store4(out + row_of(rr) * D + col_of(s), half_of(acc, rr, s));
}

struct Buffers {
  __nv_bfloat16 *o_part, *o;
  float *lse_part, *lse, *sink;
};

static void launch(int variant, int batch, const Buffers& x, cudaStream_t st) {
  if (variant == 0) {
    write_partials<<<batch * 2, THREADS, 0, st>>>(x.o_part, x.lse_part);
    combine<<<dim3(batch, H), 128, 0, st>>>(x.o_part, x.lse_part, x.sink, x.o, x.lse);
  } else if (variant == 1) {
    cluster_merge<float><<<batch * 2, THREADS, SMEM_FLOATS * sizeof(float), st>>>(x.sink, x.o, x.lse);
  } else if (variant == 2) {
    cluster_merge<__nv_bfloat16><<<batch * 2, THREADS, SMEM_FLOATS * sizeof(float), st>>>(x.sink, x.o, x.lse);
  } else {
    store_half<<<batch * 2, THREADS, 0, st>>>(x.o);
  }
  CHECK(cudaGetLastError());
}

// max |got - ref| / max |ref| of o and lse against the float64 merge
static void check(int batch, const Buffers& x, double* err_o, double* err_lse) {
  std::vector<__nv_bfloat16> o(size_t(batch) * H * D);
  std::vector<float> lse(size_t(batch) * H);
  CHECK(cudaMemcpy(o.data(), x.o, o.size() * sizeof(o[0]), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(lse.data(), x.lse, lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double eo = 0, ro = 0, el = 0, rl = 0;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < H; ++h) {
      const double l0 = lse_val(b, 0, h), l1 = lse_val(b, 1, h), sk = double(sink_val(h)) / std::log(2.0);
      const double top = std::max({l0, l1, sk}), w0 = std::exp2(l0 - top), w1 = std::exp2(l1 - top);
      const double den = w0 + w1 + std::exp2(sk - top), ref_lse = (top + std::log2(den)) * std::log(2.0);
      const double got_lse = double(lse[b * H + h]);
      el = std::max(el, std::isfinite(got_lse) ? std::fabs(got_lse - ref_lse) : INFINITY);
      rl = std::max(rl, std::fabs(ref_lse));
      for (int d = 0; d < D; ++d) {
        const double ref = (w0 * o_val(b, 0, h * D + d) + w1 * o_val(b, 1, h * D + d)) / den;
        const double got = double(__bfloat162float(o[(size_t(b) * H + h) * D + d]));
        eo = std::max(eo, std::isfinite(got) ? std::fabs(got - ref) : INFINITY);
        ro = std::max(ro, std::fabs(ref));
      }
    }
  *err_o = eo / ro;
  *err_lse = el / rl;
}

int main() {
  CHECK(cudaFuncSetAttribute(cluster_merge<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             SMEM_FLOATS * sizeof(float)));
  CHECK(cudaFuncSetAttribute(cluster_merge<__nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             SMEM_FLOATS * sizeof(float)));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs; two splits a request, %d heads x %d; per call, median of 30 graph replays of 20 calls\n",
              prop.name, prop.multiProcessorCount, H, D);
  const char* names[] = {"combine", "cluster", "cluster-bf16", "store"};
  const int calls = 20, replays = 30;
  bool ok = true;
  for (int batch : {64, 88}) {
    Buffers x;
    CHECK(cudaMalloc(&x.o_part, size_t(batch) * 2 * H * D * sizeof(__nv_bfloat16)));
    CHECK(cudaMalloc(&x.o, size_t(batch) * H * D * sizeof(__nv_bfloat16)));
    CHECK(cudaMalloc(&x.lse_part, size_t(batch) * 2 * H * sizeof(float)));
    CHECK(cudaMalloc(&x.lse, size_t(batch) * H * sizeof(float)));
    CHECK(cudaMalloc(&x.sink, H * sizeof(float)));
    std::vector<float> sink(H);
    for (int h = 0; h < H; ++h) sink[h] = sink_val(h);
    CHECK(cudaMemcpy(x.sink, sink.data(), H * sizeof(float), cudaMemcpyHostToDevice));
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    for (int v = 0; v < 4; ++v) {
      CHECK(cudaMemset(x.o, 0xff, size_t(batch) * H * D * sizeof(__nv_bfloat16)));  // NaN-poisoned
      CHECK(cudaMemset(x.lse, 0xff, size_t(batch) * H * sizeof(float)));
      launch(v, batch, x, st);
      CHECK(cudaStreamSynchronize(st));
      double err_o = 0, err_lse = 0;
      if (v < 3) check(batch, x, &err_o, &err_lse);
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      for (int c = 0; c < calls; ++c) launch(v, batch, x, st);
      CHECK(cudaStreamEndCapture(st, &graph));
      CHECK(cudaGraphInstantiate(&exec, graph, 0));
      CHECK(cudaGraphLaunch(exec, st));  // warm-up
      cudaEvent_t e0, e1;
      CHECK(cudaEventCreate(&e0));
      CHECK(cudaEventCreate(&e1));
      std::vector<float> us;
      for (int r = 0; r < replays; ++r) {
        CHECK(cudaEventRecord(e0, st));
        CHECK(cudaGraphLaunch(exec, st));
        CHECK(cudaEventRecord(e1, st));
        CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        us.push_back(ms * 1e3f / calls);
      }
      std::sort(us.begin(), us.end());
      std::printf("B %3d  %-12s %7.2f us", batch, names[v], us[us.size() / 2]);
      if (v < 3) {  // checked again on what the last replay wrote
        double after_o = 0, after_lse = 0;
        check(batch, x, &after_o, &after_lse);
        const bool good = std::max(err_o, after_o) <= 1e-2 && std::max(err_lse, after_lse) <= 1e-5;
        ok &= good;
        std::printf("   o err %.2e (after the replays %.2e)  lse err %.2e (%.2e)%s", err_o, after_o, err_lse,
                    after_lse, good ? "" : "  FAIL");
      }
      std::printf("\n");
      CHECK(cudaEventDestroy(e0));
      CHECK(cudaEventDestroy(e1));
      CHECK(cudaGraphExecDestroy(exec));
      CHECK(cudaGraphDestroy(graph));
    }
    CHECK(cudaFree(x.o_part));
    CHECK(cudaFree(x.o));
    CHECK(cudaFree(x.lse_part));
    CHECK(cudaFree(x.lse));
    CHECK(cudaFree(x.sink));
    CHECK(cudaStreamDestroy(st));
  }
  std::printf(ok ? "check: the three merges match the float64 reference\n" : "check: FAILED\n");
  return ok ? 0 : 1;
}
