//! MobileNetV2's depthwise 3×3 convolution (padding 1, stride 1 or 2) with
//! its folded-BN bias and ReLU6, as one CUDA kernel on channel-last
//! activations.
//!
//! Why: without it the CUDA path summed nine shifted slices of a padded copy
//! (`Depthwise::forward_composed`), about 30 launches and as many passes over
//! the largest activations per layer; on an H100 the whole tower ran at
//! 795 images/s against PyTorch's 12,308 (scripts/device_check.sh,
//! BENCHMARKS.md "GPU"). One thread per output element, channels fastest, so
//! neighbouring threads read neighbouring channels.
//!
//! The kernel is compiled with NVRTC the first time a process uses it (NVRTC
//! is among the libraries `cuda_libs` finds, and candle loads it anyway) and
//! accumulates in f32 for every storage type. A device or driver that cannot
//! compile or load it makes [`depthwise`] return `None`, and the caller keeps
//! the composed path: slower, never wrong.

use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::cudarc::nvrtc;
use candle_core::cuda_backend::WrapErr;
use candle_core::{CpuStorage, CudaStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

/// The kernels, one per storage type. f16 and bf16 travel as raw 16-bit
/// words and are converted by hand, so NVRTC needs no headers.
const SOURCE: &str = r#"
__device__ __forceinline__ float load_f32(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ void store_f32(float* p, long long i, float v) { p[i] = v; }

__device__ __forceinline__ float load_f16(const unsigned short* p, long long i) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(p[i]));
    return f;
}
__device__ __forceinline__ void store_f16(unsigned short* p, long long i, float v) {
    unsigned short h;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(v));
    p[i] = h;
}

__device__ __forceinline__ float load_bf16(const unsigned short* p, long long i) {
    return __uint_as_float(((unsigned int)p[i]) << 16);
}
__device__ __forceinline__ void store_bf16(unsigned short* p, long long i, float v) {
    unsigned int u = __float_as_uint(v);
    // Round to nearest even (activations after ReLU6 are finite).
    u += 0x7fffu + ((u >> 16) & 1u);
    p[i] = (unsigned short)(u >> 16);
}

#define DEPTHWISE(NAME, T, LOAD, STORE)                                              \
extern "C" __global__ void NAME(const T* x, const T* w, const T* bias, T* y,         \
                                int batch, int h, int wd, int c, int ho, int wo,     \
                                int stride) {                                        \
    long long n = (long long)batch * ho * wo * c;                                    \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;      \
         i += (long long)blockDim.x * gridDim.x) {                                   \
        int ch = (int)(i % c);                                                       \
        long long t = i / c;                                                         \
        int ox = (int)(t % wo);                                                      \
        t /= wo;                                                                     \
        int oy = (int)(t % ho);                                                      \
        long long b = t / ho;                                                        \
        float acc = LOAD(bias, ch);                                                  \
        for (int ky = 0; ky < 3; ++ky) {                                             \
            int iy = oy * stride - 1 + ky;                                           \
            if (iy < 0 || iy >= h) continue;                                         \
            for (int kx = 0; kx < 3; ++kx) {                                         \
                int ix = ox * stride - 1 + kx;                                       \
                if (ix < 0 || ix >= wd) continue;                                    \
                acc += LOAD(x, ((b * h + iy) * wd + ix) * c + ch)                    \
                     * LOAD(w, (long long)(ky * 3 + kx) * c + ch);                   \
            }                                                                        \
        }                                                                            \
        STORE(y, i, fminf(fmaxf(acc, 0.0f), 6.0f));                                  \
    }                                                                                \
}

DEPTHWISE(ncclean_depthwise_f32, float, load_f32, store_f32)
DEPTHWISE(ncclean_depthwise_f16, unsigned short, load_f16, store_f16)
DEPTHWISE(ncclean_depthwise_bf16, unsigned short, load_bf16, store_bf16)
"#;

/// Name under which candle caches the loaded module.
const MODULE: &str = "ncclean_depthwise";

/// The PTX, compiled once per process; the error text if NVRTC failed.
fn ptx() -> std::result::Result<&'static str, &'static str> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    PTX.get_or_init(|| {
        nvrtc::compile_ptx(SOURCE)
            .map(|p| p.to_src())
            .map_err(|e| format!("NVRTC could not compile the depthwise kernel: {e}"))
    })
    .as_ref()
    .map(String::as_str)
    .map_err(String::as_str)
}

/// `[B, H, W, C]` → `[B, H', W', C]`, H' = ⌈H / stride⌉: ReLU6(bias + the
/// 3×3 depthwise convolution with `weight` `[9, C]`, tap-major), or `None`
/// where the kernel is unavailable (not a CUDA tensor, NVRTC or the module
/// failed once in this process) so the caller falls back.
pub(crate) fn depthwise(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    stride: usize,
) -> Option<Result<Tensor>> {
    static BROKEN: OnceLock<String> = OnceLock::new();
    if !x.device().is_cuda() || BROKEN.get().is_some() || ptx().is_err() {
        return None;
    }
    let op = DepthwiseCuda { stride };
    let run = || x.contiguous()?.apply_op3_no_bwd(weight, bias, &op);
    match run() {
        Ok(y) => Some(Ok(y)),
        // A kernel that would not load or launch: say so once, then keep to
        // the composed path.
        Err(e) => {
            let _ = BROKEN.set(e.to_string());
            eprintln!("ncclean: the CUDA depthwise kernel failed ({e}); using composed tensor ops");
            None
        }
    }
}

struct DepthwiseCuda {
    stride: usize,
}

impl CustomOp3 for DepthwiseCuda {
    fn name(&self) -> &'static str {
        "depthwise3x3-nhwc-cuda"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("the CUDA depthwise kernel runs on CUDA tensors only")
    }

    fn cuda_fwd(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        ws: &CudaStorage,
        wl: &Layout,
        bs: &CudaStorage,
        bl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (batch, h, wd, c) = xl.shape().dims4()?;
        if wl.shape().dims() != [9, c] || bl.shape().dims() != [c] {
            candle_core::bail!(
                "depthwise kernel: weight {:?} and bias {:?} for {c} channels",
                wl.shape(),
                bl.shape()
            );
        }
        if xs.dtype() != ws.dtype() || xs.dtype() != bs.dtype() {
            candle_core::bail!(
                "depthwise kernel: input {:?}, weight {:?}, bias {:?} differ",
                xs.dtype(),
                ws.dtype(),
                bs.dtype()
            );
        }
        let (Some(xo), Some(wo_), Some(bo)) = (
            xl.contiguous_offsets(),
            wl.contiguous_offsets(),
            bl.contiguous_offsets(),
        ) else {
            candle_core::bail!("depthwise kernel: operands must be contiguous");
        };
        let s = self.stride;
        let (ho, wo) = ((h - 1) / s + 1, (wd - 1) / s + 1);
        let n = batch * ho * wo * c;
        let dev = xs.device().clone();
        let ptx = ptx().map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let threads = 256u32;
        let blocks = n.div_ceil(threads as usize).min(65_535 * 8) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let dims = [batch, h, wd, c, ho, wo, s].map(|v| v as i32);
        macro_rules! launch {
            ($t:ty, $name:literal) => {{
                let func = dev.get_or_load_custom_func($name, MODULE, ptx)?;
                let x = xs.as_cuda_slice::<$t>()?.slice(xo.0..xo.1);
                let w = ws.as_cuda_slice::<$t>()?.slice(wo_.0..wo_.1);
                let b = bs.as_cuda_slice::<$t>()?.slice(bo.0..bo.1);
                // SAFETY: every element is written by the kernel below.
                let out = unsafe { dev.alloc::<$t>(n)? };
                let mut builder = func.builder();
                builder.arg(&x);
                builder.arg(&w);
                builder.arg(&b);
                builder.arg(&out);
                for d in &dims {
                    builder.arg(d);
                }
                // SAFETY: the argument list matches the kernel's signature.
                unsafe { builder.launch(cfg) }.w()?;
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match xs.dtype() {
            DType::F32 => launch!(f32, "ncclean_depthwise_f32"),
            DType::F16 => launch!(half::f16, "ncclean_depthwise_f16"),
            DType::BF16 => launch!(half::bf16, "ncclean_depthwise_bf16"),
            other => candle_core::bail!("depthwise kernel: no {other:?} version"),
        };
        Ok((out, Shape::from((batch, ho, wo, c))))
    }
}
