//! torchvision's MobileNetV2 (width 1.0) as a frozen, pretrained image tower.
//!
//! Weights are read from a safetensors file with torchvision's key names
//! (`features.N.conv.…`, `classifier.1.…`). Every BatchNorm is folded into
//! the convolution before it at load time, which is exact in eval mode and
//! removes a pass over every activation.
//!
//! Activations are kept channel-last (`[B, H, W, C]`) internally: a 1×1
//! convolution is then one matrix product over all pixels of the batch, and
//! the depthwise 3×3 convolution reads contiguous channel vectors. candle's
//! grouped `conv2d` runs one convolution per group (960 tiny ones for the
//! widest layer), so on CPU the depthwise convolution is a hand-written loop,
//! on CUDA one kernel (`depthwise_cuda.rs`), and elsewhere a composition of
//! nine shifted slices.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use candle_core::{
    CpuStorage, CustomOp1, DType, Device, Error, InplaceOp1, InplaceOp2, Layout, Result, Shape,
    Tensor,
};

use crate::preprocess::ImagePreprocess;

/// torchvision's BatchNorm default.
const BN_EPS: f64 = 1e-5;

/// Inverted-residual stages as torchvision lists them: expansion factor,
/// output channels, repeats, stride of the first repeat.
const STAGES: [(usize, usize, usize, usize); 7] = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
];

/// Channels out of the stem convolution.
const STEM_CHANNELS: usize = 32;

/// Number of ImageNet classes of the classifier.
const CLASSES: usize = 1000;

/// How layers are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// Hand-written CPU kernels (stem, depthwise, fused epilogues) around
    /// candle's matrix product: the fast path on CPU.
    CpuKernels,
    /// Plain candle tensor operations, for any device.
    TensorOps,
}

/// Images per pass on CPU. The expanded activations of a few images stay in
/// cache between the layers that write and read them; a whole batch of 32
/// does not, and ran at about 60% of the speed (2 and 4 measured the same).
const CPU_CHUNK: usize = 4;

/// Pretrained MobileNetV2 feature extractor and ImageNet classifier.
#[derive(Debug, Clone)]
pub struct MobileNetV2 {
    stem: Stem,
    blocks: Vec<Block>,
    head: Pointwise,
    classifier_t: Tensor,
    classifier_bias: Tensor,
    /// Dtype of the weights and of the computation (outputs are f32).
    dtype: DType,
}

/// Output of a forward pass.
#[derive(Debug, Clone)]
pub struct MobileNetOutput {
    /// `[B, 49, 1280]` local features: the 7×7 map of `features.18`,
    /// flattened row-major (index `y * 7 + x`).
    pub grid: Tensor,
    /// `[B, 1280]` global average of `grid` over its positions.
    pub pooled: Tensor,
}

impl MobileNetV2 {
    /// Width of [`MobileNetOutput::pooled`] and of each grid position.
    pub const FEATURE_DIM: usize = 1280;
    /// Number of grid positions (7×7) for a 224×224 input.
    pub const GRID: usize = 49;

    /// Load torchvision weights from a safetensors file onto `device`.
    /// Errors name the file and, where one is missing or misshapen, the key.
    pub fn load(path: &Path, device: &Device) -> Result<Self> {
        Self::load_with_dtype(path, device, DType::F32)
    }

    /// [`MobileNetV2::load`] computing in `dtype` (f32, f16 or bf16). BN is
    /// folded in f64 and the folded weights rounded once to `dtype`; the
    /// outputs are f32 either way. Off f32, the CPU runs candle's generic
    /// tensor ops (the hand-written CPU kernels are f32-only).
    pub fn load_with_dtype(path: &Path, device: &Device, dtype: DType) -> Result<Self> {
        let tensors = candle_core::safetensors::load(path, &Device::Cpu)
            .map_err(|e| Error::Msg(format!("cannot read {}: {e}", path.display())))?;
        let w = Weights {
            tensors,
            source: path.display().to_string(),
            device: device.clone(),
            dtype: float_dtype(dtype)?,
        };
        Self::from_weights(&w)
    }

    /// A randomly initialised, correctly shaped network (weights sized so
    /// activations stay O(1)), for benchmarks and tests that need the
    /// architecture but not the ImageNet weights.
    pub fn synthetic(device: &Device, dtype: DType) -> Result<Self> {
        Self::from_weights(&Weights {
            tensors: synthetic_weights(),
            source: "synthetic".into(),
            device: device.clone(),
            dtype: float_dtype(dtype)?,
        })
    }

    /// The dtype the network computes in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    fn from_weights(w: &Weights) -> Result<Self> {
        let stem = Stem::load(w)?;
        let mut blocks = Vec::new();
        let mut c_in = STEM_CHANNELS;
        let mut index = 1;
        for &(expand, c_out, repeats, first_stride) in &STAGES {
            for r in 0..repeats {
                let stride = if r == 0 { first_stride } else { 1 };
                blocks.push(Block::load(w, index, c_in, c_out, expand, stride)?);
                c_in = c_out;
                index += 1;
            }
        }
        let head = Pointwise::load(
            w,
            &format!("features.{index}.0"),
            &format!("features.{index}.1"),
            c_in,
            Self::FEATURE_DIM,
            true,
        )?;
        let classifier = w.get("classifier.1.weight", &[CLASSES, Self::FEATURE_DIM])?;
        let classifier_bias = w.get("classifier.1.bias", &[CLASSES])?;
        Ok(MobileNetV2 {
            stem,
            blocks,
            head,
            classifier_t: w.to_device(&classifier.t()?.contiguous()?)?,
            classifier_bias: w.to_device(&classifier_bias)?,
            dtype: w.dtype,
        })
    }

    /// Features of a batch `[B, 3, H, W]` preprocessed with
    /// [`MobileNetV2::preprocess`]. At 224×224 the grid is 7×7.
    pub fn forward(&self, x: &Tensor) -> Result<MobileNetOutput> {
        let (b, c, _, _) = x.dims4()?;
        if c != 3 {
            candle_core::bail!(
                "MobileNetV2 expects [B, 3, H, W] images, got {:?}",
                x.shape()
            );
        }
        let x = x.to_dtype(self.dtype)?;
        if !x.device().is_cpu() || self.dtype != DType::F32 {
            return self.forward_chunk(&x, Backend::TensorOps);
        }
        if b <= CPU_CHUNK {
            return self.forward_chunk(&x, Backend::CpuKernels);
        }
        // Whole chunks run in parallel on candle's thread pool, handed out
        // one at a time so a slow worker does not hold up the batch. On two
        // idle cores this did ~135 images/s against ~89 for running chunks
        // one after another with each layer split across the cores. (The
        // layers still ask the pool for parallelism; that only matters once
        // the other workers have run out of chunks.)
        let x = x.contiguous()?;
        let n_chunks = b.div_ceil(CPU_CHUNK);
        let next = AtomicUsize::new(0);
        let results: Vec<Mutex<Option<Result<MobileNetOutput>>>> =
            (0..n_chunks).map(|_| Mutex::new(None)).collect();
        let workers = candle_core::utils::get_num_threads().clamp(1, n_chunks);
        candle_core::cpu::kernels::par_for_each(workers, |_| loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n_chunks {
                break;
            }
            let start = i * CPU_CHUNK;
            let out = x
                .narrow(0, start, CPU_CHUNK.min(b - start))
                .and_then(|chunk| self.forward_chunk(&chunk, Backend::CpuKernels));
            *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(out);
        });
        let mut grids = Vec::with_capacity(n_chunks);
        let mut pooled = Vec::with_capacity(n_chunks);
        for slot in results {
            let out = slot
                .into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every chunk is claimed by a worker")?;
            grids.push(out.grid);
            pooled.push(out.pooled);
        }
        Ok(MobileNetOutput {
            grid: Tensor::cat(&grids, 0)?,
            pooled: Tensor::cat(&pooled, 0)?,
        })
    }

    fn forward_chunk(&self, x: &Tensor, backend: Backend) -> Result<MobileNetOutput> {
        let mut h = self.stem.forward(x, backend)?;
        for block in &self.blocks {
            h = block.forward(&h, backend)?;
        }
        let (b, gh, gw, _) = h.dims4()?;
        let flat = h.reshape((b * gh * gw, ()))?;
        let grid = self
            .head
            .forward(&flat, None, backend)?
            .reshape((b, gh * gw, ()))?
            // f16 would lose digits summing 49 positions: pool in f32.
            .to_dtype(DType::F32)?;
        let pooled = grid.mean(1)?;
        Ok(MobileNetOutput { grid, pooled })
    }

    /// ImageNet logits `[B, 1000]` from pooled features (`classifier.1`;
    /// its dropout is the identity in eval mode).
    pub fn logits(&self, pooled: &Tensor) -> Result<Tensor> {
        pooled
            .to_dtype(self.dtype)?
            .matmul(&self.classifier_t)?
            .broadcast_add(&self.classifier_bias)?
            .to_dtype(DType::F32)
    }

    /// The preprocessing the weights were trained with.
    pub fn preprocess() -> ImagePreprocess {
        ImagePreprocess::imagenet()
    }
}

/// The loaded safetensors file, with lookups that name what is wrong.
struct Weights {
    tensors: HashMap<String, Tensor>,
    source: String,
    device: Device,
    /// Dtype of the tensors handed to the network.
    dtype: DType,
}

/// `dtype` if it is one the network can compute in.
fn float_dtype(dtype: DType) -> Result<DType> {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => Ok(dtype),
        other => candle_core::bail!("MobileNetV2 computes in f32, f16 or bf16, not {other:?}"),
    }
}

impl Weights {
    fn get(&self, key: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self
            .tensors
            .get(key)
            .ok_or_else(|| Error::Msg(format!("{}: missing tensor `{key}`", self.source)))?;
        if t.dims() != shape {
            candle_core::bail!(
                "{}: tensor `{key}` has shape {:?}, expected {shape:?}",
                self.source,
                t.dims()
            );
        }
        t.to_dtype(DType::F32)
    }

    /// Convolution `conv.weight` with BatchNorm `bn` folded in.
    fn conv_bn(
        &self,
        conv: &str,
        bn: &str,
        shape: (usize, usize, usize, usize),
    ) -> Result<(Tensor, Tensor)> {
        let c_out = shape.0;
        let weight = self.get(
            &format!("{conv}.weight"),
            &[shape.0, shape.1, shape.2, shape.3],
        )?;
        let bn = BatchNorm {
            gamma: self.get(&format!("{bn}.weight"), &[c_out])?,
            beta: self.get(&format!("{bn}.bias"), &[c_out])?,
            mean: self.get(&format!("{bn}.running_mean"), &[c_out])?,
            var: self.get(&format!("{bn}.running_var"), &[c_out])?,
        };
        fold_batch_norm(&weight, &bn, BN_EPS)
    }

    fn to_device(&self, t: &Tensor) -> Result<Tensor> {
        t.to_dtype(self.dtype)?.to_device(&self.device)
    }
}

/// Eval-mode BatchNorm parameters, one value per channel.
#[derive(Debug, Clone)]
struct BatchNorm {
    gamma: Tensor,
    beta: Tensor,
    mean: Tensor,
    var: Tensor,
}

/// Fold `bn` into the bias-free convolution `weight` `[C_out, …]`:
/// w' = w·γ/√(var+eps), b' = β − mean·γ/√(var+eps). Computed in f64 so the
/// folded f32 weights are the correctly rounded values.
fn fold_batch_norm(weight: &Tensor, bn: &BatchNorm, eps: f64) -> Result<(Tensor, Tensor)> {
    let f64_of = |t: &Tensor| t.to_dtype(DType::F64);
    let scale = (f64_of(&bn.gamma)? / (f64_of(&bn.var)? + eps)?.sqrt()?)?;
    let mut per_channel = vec![1; weight.rank()];
    per_channel[0] = weight.dim(0)?;
    let w = f64_of(weight)?.broadcast_mul(&scale.reshape(per_channel)?)?;
    let b = (f64_of(&bn.beta)? - (f64_of(&bn.mean)? * scale)?)?;
    Ok((w.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?))
}

/// `features.0`: 3×3 stride-2 convolution, folded BN, ReLU6.
#[derive(Debug, Clone)]
struct Stem {
    /// `[32, 3, 3, 3]` for candle's convolution off the CPU.
    weight: Tensor,
    bias: Tensor,
    /// Host copies for the CPU kernel; weights `[3·3·3, 32]`, input-tap-major.
    weight_host: Vec<f32>,
    bias_host: Vec<f32>,
}

impl Stem {
    fn load(w: &Weights) -> Result<Self> {
        let (weight, bias) = w.conv_bn("features.0.0", "features.0.1", (STEM_CHANNELS, 3, 3, 3))?;
        let weight_host = weight
            .reshape((STEM_CHANNELS, 27))?
            .t()?
            .flatten_all()?
            .to_vec1()?;
        Ok(Stem {
            weight: w.to_device(&weight)?,
            bias: w.to_device(&bias)?,
            weight_host,
            bias_host: bias.to_vec1()?,
        })
    }

    /// `[B, 3, H, W]` → `[B, ⌈H/2⌉, ⌈W/2⌉, 32]` (channel-last from here on).
    fn forward(&self, x: &Tensor, backend: Backend) -> Result<Tensor> {
        if backend == Backend::CpuKernels {
            return x.apply_op1_no_bwd(&StemCpu {
                weight: &self.weight_host,
                bias: &self.bias_host,
            });
        }
        let y = x
            .conv2d(&self.weight, 1, 2, 1, 1)?
            .broadcast_add(&self.bias.reshape((1, (), 1, 1))?)?;
        relu6(&y)?.permute((0, 2, 3, 1))?.contiguous()
    }
}

/// The stem as one CPU pass: NCHW in, NHWC out, bias and ReLU6 fused.
/// candle's convolution followed by a transpose and two activation passes
/// took several times longer, mostly in memory traffic.
struct StemCpu<'a> {
    weight: &'a [f32],
    bias: &'a [f32],
}

impl CustomOp1 for StemCpu<'_> {
    fn name(&self) -> &'static str {
        "mobilenet-stem"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (b, c_in, h, w) = layout.shape().dims4()?;
        let c_out = self.bias.len();
        if c_in * 9 * c_out != self.weight.len() {
            candle_core::bail!(
                "stem expects {} input channels, got {c_in}",
                self.weight.len() / 9 / c_out
            );
        }
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("stem needs a contiguous input");
        };
        let input = &storage.as_slice::<f32>()?[start..end];
        let g = StemGeometry {
            c_in,
            h,
            w,
            ho: (h - 1) / 2 + 1,
            wo: (w - 1) / 2 + 1,
        };
        let mut out = vec![0f32; b * g.ho * g.wo * c_out];
        par_rows(&mut out, g.wo * c_out, |first_row, chunk| {
            stem_rows(input, &g, self.weight, self.bias, first_row, chunk)
        });
        Ok((CpuStorage::F32(out), Shape::from((b, g.ho, g.wo, c_out))))
    }
}

/// Sizes of the stem convolution (NCHW input, output Ho×Wo).
struct StemGeometry {
    c_in: usize,
    h: usize,
    w: usize,
    ho: usize,
    wo: usize,
}

/// Compute stem output rows `first_row..` (row = image · Ho + y) into `out`.
fn stem_rows(
    input: &[f32],
    g: &StemGeometry,
    weight: &[f32],
    bias: &[f32],
    first_row: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, the only thing the callee assumes.
        unsafe { stem_rows_avx2(input, g, weight, bias, first_row, out) };
        return;
    }
    stem_rows_portable(input, g, weight, bias, first_row, out);
}

/// [`stem_rows_portable`] compiled for AVX2 (see [`depthwise_rows_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stem_rows_avx2(
    input: &[f32],
    g: &StemGeometry,
    weight: &[f32],
    bias: &[f32],
    first_row: usize,
    out: &mut [f32],
) {
    stem_rows_portable(input, g, weight, bias, first_row, out);
}

/// Direct convolution: each output pixel is the bias plus, for each of the
/// 27 input taps, the tap value times a contiguous row of output weights.
#[inline(always)]
fn stem_rows_portable(
    input: &[f32],
    g: &StemGeometry,
    weight: &[f32],
    bias: &[f32],
    first_row: usize,
    out: &mut [f32],
) {
    let c_out = bias.len();
    let plane = g.h * g.w;
    for (r, out_row) in out.chunks_exact_mut(g.wo * c_out).enumerate() {
        let (n, oy) = ((first_row + r) / g.ho, (first_row + r) % g.ho);
        let image = &input[n * g.c_in * plane..(n + 1) * g.c_in * plane];
        for (ox, acc) in out_row.chunks_exact_mut(c_out).enumerate() {
            acc.copy_from_slice(bias);
            for ky in 0..3 {
                // Stride 2, padding 1.
                let Some(iy) = (2 * oy + ky).checked_sub(1).filter(|&y| y < g.h) else {
                    continue;
                };
                for kx in 0..3 {
                    let Some(ix) = (2 * ox + kx).checked_sub(1).filter(|&x| x < g.w) else {
                        continue;
                    };
                    for ci in 0..g.c_in {
                        let v = image[ci * plane + iy * g.w + ix];
                        let k = (ci * 3 + ky) * 3 + kx;
                        for (a, &wv) in acc.iter_mut().zip(&weight[k * c_out..(k + 1) * c_out]) {
                            *a += v * wv;
                        }
                    }
                }
            }
            for a in acc.iter_mut() {
                *a = a.clamp(0.0, 6.0);
            }
        }
    }
}

/// ReLU6 = min(max(x, 0), 6).
fn relu6(x: &Tensor) -> Result<Tensor> {
    x.clamp(0f32, 6f32)
}

/// A 1×1 convolution with folded BN, applied as a matrix product to
/// channel-last pixels `[M, C_in]`.
#[derive(Debug, Clone)]
struct Pointwise {
    weight_t: Tensor,
    bias: Tensor,
    bias_host: Vec<f32>,
    relu6: bool,
}

impl Pointwise {
    fn load(
        w: &Weights,
        conv: &str,
        bn: &str,
        c_in: usize,
        c_out: usize,
        relu6: bool,
    ) -> Result<Self> {
        let (weight, bias) = w.conv_bn(conv, bn, (c_out, c_in, 1, 1))?;
        let weight_t = weight.reshape((c_out, c_in))?.t()?.contiguous()?;
        Ok(Pointwise {
            weight_t: w.to_device(&weight_t)?,
            bias_host: bias.to_vec1()?,
            bias: w.to_device(&bias)?,
            relu6,
        })
    }

    /// `[M, C_in]` → `[M, C_out]`, adding `residual` (same shape as the
    /// output) before the activation if given.
    fn forward(&self, x: &Tensor, residual: Option<&Tensor>, backend: Backend) -> Result<Tensor> {
        if backend == Backend::TensorOps {
            let mut y = x.matmul(&self.weight_t)?.broadcast_add(&self.bias)?;
            if let Some(r) = residual {
                y = (y + r)?;
            }
            if self.relu6 {
                y = relu6(&y)?;
            }
            return Ok(y);
        }
        let y = x.matmul(&self.weight_t)?;
        // The product is a fresh tensor nobody else holds, so the epilogue
        // can overwrite it: one pass and no new allocation instead of up to
        // four of each.
        let op = Epilogue {
            bias: &self.bias_host,
            relu6: self.relu6,
        };
        match residual {
            Some(r) => y.inplace_op2(r, &op)?,
            None => y.inplace_op1(&op)?,
        }
        Ok(y)
    }
}

/// In-place `y = act(y + bias [+ residual])` over rows of a `[M, C]` CPU
/// tensor, where act is ReLU6 or the identity.
struct Epilogue<'a> {
    bias: &'a [f32],
    relu6: bool,
}

impl Epilogue<'_> {
    fn run(&self, y: &mut CpuStorage, layout: &Layout, residual: Option<&[f32]>) -> Result<()> {
        let c = self.bias.len();
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("epilogue needs a contiguous tensor");
        };
        let CpuStorage::F32(data) = y else {
            candle_core::bail!("epilogue needs f32");
        };
        let data = &mut data[start..end];
        if data.len() % c != 0 || residual.is_some_and(|r| r.len() != data.len()) {
            candle_core::bail!("epilogue: {} values do not fit {c} channels", data.len());
        }
        par_rows(data, c, |first_row, chunk| {
            let res = residual.map(|r| &r[first_row * c..first_row * c + chunk.len()]);
            for (i, row) in chunk.chunks_exact_mut(c).enumerate() {
                for (v, &b) in row.iter_mut().zip(self.bias) {
                    *v += b;
                }
                if let Some(res) = res {
                    for (v, &r) in row.iter_mut().zip(&res[i * c..(i + 1) * c]) {
                        *v += r;
                    }
                }
                if self.relu6 {
                    for v in row.iter_mut() {
                        *v = v.clamp(0.0, 6.0);
                    }
                }
            }
        });
        Ok(())
    }
}

impl InplaceOp1 for Epilogue<'_> {
    fn name(&self) -> &'static str {
        "bias-relu6"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        self.run(storage, layout, None)
    }
}

impl InplaceOp2 for Epilogue<'_> {
    fn name(&self) -> &'static str {
        "bias-residual-relu6"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let Some((start, end)) = l2.contiguous_offsets() else {
            candle_core::bail!("residual needs a contiguous tensor");
        };
        self.run(s1, l1, Some(&s2.as_slice::<f32>()?[start..end]))
    }
}

/// A depthwise 3×3 convolution (padding 1) with folded BN and ReLU6, on
/// channel-last activations.
#[derive(Debug, Clone)]
struct Depthwise {
    /// `[9, C]`: tap-major so that each tap's weights are contiguous.
    weight: Tensor,
    bias: Tensor,
    /// Host copies for the CPU kernel.
    weight_host: Vec<f32>,
    bias_host: Vec<f32>,
    stride: usize,
}

impl Depthwise {
    fn load(w: &Weights, conv: &str, bn: &str, channels: usize, stride: usize) -> Result<Self> {
        let (weight, bias) = w.conv_bn(conv, bn, (channels, 1, 3, 3))?;
        let weight = weight.reshape((channels, 9))?.t()?.contiguous()?;
        Ok(Depthwise {
            weight_host: weight.flatten_all()?.to_vec1()?,
            bias_host: bias.to_vec1()?,
            weight: w.to_device(&weight)?,
            bias: w.to_device(&bias)?,
            stride,
        })
    }

    /// `[B, H, W, C]` → `[B, H', W', C]` with H' = ⌈H / stride⌉.
    fn forward(&self, x: &Tensor, backend: Backend) -> Result<Tensor> {
        match backend {
            Backend::CpuKernels => self.forward_cpu(x),
            Backend::TensorOps => {
                // On CUDA one kernel does what the composition does in ~30
                // launches (models/src/depthwise_cuda.rs says why).
                #[cfg(feature = "cuda")]
                if let Some(y) =
                    crate::depthwise_cuda::depthwise(x, &self.weight, &self.bias, self.stride)
                {
                    return y;
                }
                self.forward_composed(x)
            }
        }
    }

    fn forward_cpu(&self, x: &Tensor) -> Result<Tensor> {
        x.apply_op1_no_bwd(&DepthwiseCpu {
            weight: &self.weight_host,
            bias: &self.bias_host,
            stride: self.stride,
        })
    }

    /// Device-independent version: zero-pad, then sum nine shifted slices
    /// times per-channel weights. For stride 2 the padded map is viewed as
    /// pairs of rows and columns, so each tap is a slice of one parity and
    /// nothing is computed only to be discarded.
    fn forward_composed(&self, x: &Tensor) -> Result<Tensor> {
        let (b, h, w, c) = x.dims4()?;
        let s = self.stride;
        let (ho, wo) = ((h - 1) / s + 1, (w - 1) / s + 1);
        // Pad to 1 + s·(out−1) + 2 rows at least, and to a multiple of s.
        let padded_len = |n: usize, out: usize| (s * (out - 1) + 3).max(n + 2).div_ceil(s) * s;
        let (hp, wp) = (padded_len(h, ho), padded_len(w, wo));
        let xp = x
            .pad_with_zeros(1, 1, hp - h - 1)?
            .pad_with_zeros(2, 1, wp - w - 1)?
            .reshape((b, hp / s, s, wp / s, s, c))?;
        let mut acc = self
            .bias
            .reshape((1, 1, 1, c))?
            .broadcast_as((b, ho, wo, c))?;
        for ky in 0..3 {
            for kx in 0..3 {
                let tap = xp
                    .narrow(1, ky / s, ho)?
                    .narrow(2, ky % s, 1)?
                    .narrow(3, kx / s, wo)?
                    .narrow(4, kx % s, 1)?
                    .reshape((b, ho, wo, c))?;
                let wt = self.weight.get(ky * 3 + kx)?.reshape((1, 1, 1, c))?;
                acc = (acc + tap.broadcast_mul(&wt)?)?;
            }
        }
        relu6(&acc)
    }
}

/// The CPU depthwise kernel as a candle op (fused bias and ReLU6).
struct DepthwiseCpu<'a> {
    weight: &'a [f32],
    bias: &'a [f32],
    stride: usize,
}

impl CustomOp1 for DepthwiseCpu<'_> {
    fn name(&self) -> &'static str {
        "depthwise3x3-nhwc"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (b, h, w, c) = layout.shape().dims4()?;
        if c != self.bias.len() {
            candle_core::bail!("depthwise conv has {} channels, input {c}", self.bias.len());
        }
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("depthwise conv needs a contiguous input");
        };
        let input = &storage.as_slice::<f32>()?[start..end];
        let s = self.stride;
        let (ho, wo) = ((h - 1) / s + 1, (w - 1) / s + 1);
        let mut out = vec![0f32; b * ho * wo * c];
        let geom = DepthwiseGeometry {
            h,
            w,
            c,
            ho,
            wo,
            stride: s,
        };
        par_rows(&mut out, wo * c, |first_row, chunk| {
            depthwise_rows(input, &geom, self.weight, self.bias, first_row, chunk)
        });
        Ok((CpuStorage::F32(out), Shape::from((b, ho, wo, c))))
    }
}

/// Sizes of one depthwise convolution (input H×W×C, output Ho×Wo×C).
struct DepthwiseGeometry {
    h: usize,
    w: usize,
    c: usize,
    ho: usize,
    wo: usize,
    stride: usize,
}

/// Compute output rows `first_row..` (row = image · Ho + y) into `out`.
fn depthwise_rows(
    input: &[f32],
    g: &DepthwiseGeometry,
    weight: &[f32],
    bias: &[f32],
    first_row: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, the only thing the callee assumes.
        unsafe { depthwise_rows_avx2(input, g, weight, bias, first_row, out) };
        return;
    }
    depthwise_rows_portable(input, g, weight, bias, first_row, out);
}

/// [`depthwise_rows_portable`] compiled for AVX2: the default x86-64
/// target only assumes SSE2, and the wider loop was 1.3–1.6× faster.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn depthwise_rows_avx2(
    input: &[f32],
    g: &DepthwiseGeometry,
    weight: &[f32],
    bias: &[f32],
    first_row: usize,
    out: &mut [f32],
) {
    depthwise_rows_portable(input, g, weight, bias, first_row, out);
}

/// The kernel proper. Channel-last input makes every tap a contiguous
/// multiply-add over channels, which the compiler vectorises. (Holding a
/// block of channels in registers across all nine taps measured slower.)
#[inline(always)]
fn depthwise_rows_portable(
    input: &[f32],
    g: &DepthwiseGeometry,
    weight: &[f32],
    bias: &[f32],
    first_row: usize,
    out: &mut [f32],
) {
    let c = g.c;
    for (r, out_row) in out.chunks_exact_mut(g.wo * c).enumerate() {
        let (n, oy) = ((first_row + r) / g.ho, (first_row + r) % g.ho);
        let image = &input[n * g.h * g.w * c..(n + 1) * g.h * g.w * c];
        for (ox, acc) in out_row.chunks_exact_mut(c).enumerate() {
            acc.copy_from_slice(bias);
            for ky in 0..3 {
                // Padding 1: tap (ky, kx) reads pixel (oy·s + ky − 1, ox·s + kx − 1).
                let Some(iy) = (oy * g.stride + ky).checked_sub(1).filter(|&y| y < g.h) else {
                    continue;
                };
                for kx in 0..3 {
                    let Some(ix) = (ox * g.stride + kx).checked_sub(1).filter(|&x| x < g.w) else {
                        continue;
                    };
                    let src = &image[(iy * g.w + ix) * c..][..c];
                    let wt = &weight[(ky * 3 + kx) * c..][..c];
                    for ((a, &v), &k) in acc.iter_mut().zip(src).zip(wt) {
                        *a += v * k;
                    }
                }
            }
            for a in acc.iter_mut() {
                *a = a.clamp(0.0, 6.0);
            }
        }
    }
}

/// Run `f(first_row, chunk)` over `out` split into whole rows of `row_len`
/// values, on candle's own (rayon) thread pool. Separate OS threads were
/// slower: they fought gemm's pool workers, which spin for a while after
/// each product, for the same few cores.
fn par_rows(out: &mut [f32], row_len: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let rows = out.len() / row_len.max(1);
    let threads = candle_core::utils::get_num_threads().clamp(1, rows.max(1));
    if threads == 1 {
        f(0, out);
        return;
    }
    let per_thread = rows.div_ceil(threads);
    // The pool hands every task the same closure; a mutex per chunk turns
    // the disjoint `&mut` pieces into something it can share (each lock is
    // taken once, uncontended).
    let chunks: Vec<std::sync::Mutex<&mut [f32]>> = out
        .chunks_mut(per_thread * row_len)
        .map(std::sync::Mutex::new)
        .collect();
    candle_core::cpu::kernels::par_for_each(chunks.len(), |i| {
        let mut chunk = chunks[i].lock().unwrap_or_else(|e| e.into_inner());
        f(i * per_thread, &mut chunk);
    });
}

/// One inverted-residual block (`features.1` … `features.17`).
#[derive(Debug, Clone)]
struct Block {
    expand: Option<Pointwise>,
    depthwise: Depthwise,
    project: Pointwise,
    residual: bool,
}

impl Block {
    fn load(
        w: &Weights,
        index: usize,
        c_in: usize,
        c_out: usize,
        expand_ratio: usize,
        stride: usize,
    ) -> Result<Self> {
        let p = format!("features.{index}.conv");
        let hidden = c_in * expand_ratio;
        // Without expansion torchvision's Sequential starts at the depthwise
        // conv, so every later index shifts down by one.
        let (expand, next) = if expand_ratio == 1 {
            (None, 0)
        } else {
            let e = Pointwise::load(
                w,
                &format!("{p}.0.0"),
                &format!("{p}.0.1"),
                c_in,
                hidden,
                true,
            )?;
            (Some(e), 1)
        };
        let depthwise = Depthwise::load(
            w,
            &format!("{p}.{next}.0"),
            &format!("{p}.{next}.1"),
            hidden,
            stride,
        )?;
        let project = Pointwise::load(
            w,
            &format!("{p}.{}", next + 1),
            &format!("{p}.{}", next + 2),
            hidden,
            c_out,
            false,
        )?;
        Ok(Block {
            expand,
            depthwise,
            project,
            residual: stride == 1 && c_in == c_out,
        })
    }

    /// `[B, H, W, C_in]` → `[B, H', W', C_out]`.
    fn forward(&self, x: &Tensor, backend: Backend) -> Result<Tensor> {
        let (b, h, w, c) = x.dims4()?;
        let flat = x.reshape((b * h * w, c))?;
        let hidden = match &self.expand {
            Some(e) => e.forward(&flat, None, backend)?,
            None => flat.clone(),
        };
        let hidden = self
            .depthwise
            .forward(&hidden.reshape((b, h, w, ()))?, backend)?;
        let (_, ho, wo, ch) = hidden.dims4()?;
        let residual = if self.residual { Some(&flat) } else { None };
        let y = self
            .project
            .forward(&hidden.reshape((b * ho * wo, ch))?, residual, backend)?;
        y.reshape((b, ho, wo, ()))
    }
}

/// Deterministic pseudo-random values in [-1, 1) (synthetic weights and
/// hand-sized tests).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = crate::rng::Rng::derive(seed, "mobilenet-test");
    (0..n).map(|_| (rng.uniform() * 2.0 - 1.0) as f32).collect()
}

/// A random, correctly shaped torchvision state dict (weights sized so
/// activations stay O(1)).
fn synthetic_weights() -> HashMap<String, Tensor> {
    let mut map = HashMap::new();
    let mut seed = 100;
    let mut put = |key: String, shape: &[usize], scale: f32, offset: f32| {
        seed += 1;
        let n = shape.iter().product();
        let v = values(n, seed)
            .into_iter()
            .map(|x| x * scale + offset)
            .collect();
        map.insert(key, Tensor::from_vec(v, shape, &Device::Cpu).unwrap());
    };
    let mut conv_bn = |conv: String, bn: String, shape: [usize; 4]| {
        let fan_in = (shape[1] * shape[2] * shape[3]) as f32;
        put(format!("{conv}.weight"), &shape, 1.7 / fan_in.sqrt(), 0.0);
        put(format!("{bn}.weight"), &shape[..1], 0.2, 1.0);
        put(format!("{bn}.bias"), &shape[..1], 0.2, 0.1);
        put(format!("{bn}.running_mean"), &shape[..1], 0.1, 0.0);
        put(format!("{bn}.running_var"), &shape[..1], 0.3, 1.0);
    };
    conv_bn("features.0.0".into(), "features.0.1".into(), [32, 3, 3, 3]);
    let (mut c_in, mut index) = (STEM_CHANNELS, 1);
    for &(t, c_out, repeats, _) in &STAGES {
        for _ in 0..repeats {
            let p = format!("features.{index}.conv");
            let hidden = c_in * t;
            let mut next = 0;
            if t != 1 {
                conv_bn(format!("{p}.0.0"), format!("{p}.0.1"), [hidden, c_in, 1, 1]);
                next = 1;
            }
            conv_bn(
                format!("{p}.{next}.0"),
                format!("{p}.{next}.1"),
                [hidden, 1, 3, 3],
            );
            conv_bn(
                format!("{p}.{}", next + 1),
                format!("{p}.{}", next + 2),
                [c_out, hidden, 1, 1],
            );
            (c_in, index) = (c_out, index + 1);
        }
    }
    conv_bn(
        format!("features.{index}.0"),
        format!("features.{index}.1"),
        [1280, c_in, 1, 1],
    );
    let mut put2 = |key: &str, shape: &[usize]| {
        let n = shape.iter().product();
        let v = values(n, shape.len() as u64 + 7)
            .into_iter()
            .map(|x| x * 0.03)
            .collect();
        map.insert(
            key.to_string(),
            Tensor::from_vec(v, shape, &Device::Cpu).unwrap(),
        );
    };
    put2("classifier.1.weight", &[CLASSES, 1280]);
    put2("classifier.1.bias", &[CLASSES]);
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    #[test]
    fn folded_batch_norm_matches_conv_then_batch_norm() {
        let dev = Device::Cpu;
        let x = Tensor::from_vec(values(2 * 5 * 5, 1), (1, 2, 5, 5), &dev).unwrap();
        let w = Tensor::from_vec(values(3 * 2 * 3 * 3, 2), (3, 2, 3, 3), &dev).unwrap();
        let t = |v: [f32; 3]| Tensor::new(&v, &dev).unwrap();
        let bn = BatchNorm {
            gamma: t([1.5, -0.5, 0.8]),
            beta: t([0.1, 0.2, -0.3]),
            mean: t([0.3, -1.0, 0.05]),
            var: t([0.5, 2.0, 0.01]),
        };
        let eps = 1e-5;
        let per_channel = |v: &Tensor| v.reshape((1, 3, 1, 1)).unwrap();
        let conv = x.conv2d(&w, 1, 1, 1, 1).unwrap();
        let normalised = conv
            .broadcast_sub(&per_channel(&bn.mean))
            .unwrap()
            .broadcast_div(&per_channel(&(&bn.var + eps).unwrap().sqrt().unwrap()))
            .unwrap();
        let want = normalised
            .broadcast_mul(&per_channel(&bn.gamma))
            .unwrap()
            .broadcast_add(&per_channel(&bn.beta))
            .unwrap();
        let (wf, bf) = fold_batch_norm(&w, &bn, eps).unwrap();
        let got = x
            .conv2d(&wf, 1, 1, 1, 1)
            .unwrap()
            .broadcast_add(&per_channel(&bf))
            .unwrap();
        let d = max_abs_diff(&got, &want);
        assert!(d < 1e-4, "folded vs unfolded differ by {d}");
        // One channel by hand: w·γ/√(var+eps) and β − mean·γ/√(var+eps).
        let s = 0.8 / (0.01f64 + 1e-5).sqrt();
        let w2 = w
            .get(2)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let wf2 = wf
            .get(2)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for (a, b) in w2.iter().zip(&wf2) {
            assert!(((f64::from(*a) * s) as f32 - b).abs() < 1e-5);
        }
        let b2 = bf.to_vec1::<f32>().unwrap()[2];
        assert!((b2 - (-0.3 - 0.05 * s) as f32).abs() < 1e-5, "{b2}");
    }

    fn random_depthwise(c: usize, stride: usize) -> Depthwise {
        let dev = Device::Cpu;
        let weight_host = values(9 * c, 3);
        let bias_host = values(c, 4);
        Depthwise {
            weight: Tensor::from_vec(weight_host.clone(), (9, c), &dev).unwrap(),
            bias: Tensor::from_vec(bias_host.clone(), c, &dev).unwrap(),
            weight_host,
            bias_host,
            stride,
        }
    }

    /// candle's own grouped convolution on NCHW as the reference.
    fn depthwise_reference(dw: &Depthwise, x_nhwc: &Tensor) -> Tensor {
        let c = dw.bias_host.len();
        let kernel = dw.weight.t().unwrap().reshape((c, 1, 3, 3)).unwrap();
        let x = x_nhwc.permute((0, 3, 1, 2)).unwrap().contiguous().unwrap();
        let y = x
            .conv2d(&kernel, 1, dw.stride, 1, c)
            .unwrap()
            .broadcast_add(&dw.bias.reshape((1, c, 1, 1)).unwrap())
            .unwrap();
        relu6(&y)
            .unwrap()
            .permute((0, 2, 3, 1))
            .unwrap()
            .contiguous()
            .unwrap()
    }

    #[test]
    fn depthwise_kernels_match_grouped_conv() {
        for (h, w, stride) in [(6, 6, 1), (6, 6, 2), (5, 7, 2), (7, 5, 1), (1, 1, 2)] {
            let c = 5;
            let dw = random_depthwise(c, stride);
            // Scale up so ReLU6 clips at both ends somewhere.
            let x = (Tensor::from_vec(values(2 * h * w * c, 5), (2, h, w, c), &Device::Cpu)
                .unwrap()
                * 4.0)
                .unwrap();
            let want = depthwise_reference(&dw, &x);
            let cpu = dw.forward_cpu(&x).unwrap();
            let composed = dw.forward_composed(&x).unwrap();
            assert_eq!(cpu.dims(), want.dims(), "{h}x{w} stride {stride}");
            assert_eq!(composed.dims(), want.dims(), "{h}x{w} stride {stride}");
            assert!(max_abs_diff(&cpu, &want) < 1e-5, "cpu {h}x{w}/{stride}");
            assert!(
                max_abs_diff(&composed, &want) < 1e-5,
                "composed {h}x{w}/{stride}"
            );
        }
    }

    fn synthetic_model() -> MobileNetV2 {
        MobileNetV2::from_weights(&Weights {
            tensors: synthetic_weights(),
            source: "synthetic".into(),
            device: Device::Cpu,
            dtype: DType::F32,
        })
        .unwrap()
    }

    #[test]
    fn cpu_kernels_match_plain_tensor_ops_on_the_whole_network() {
        let model = synthetic_model();
        // Odd intermediate sizes (48 → 24 → 12 → 6 → 3 → 2 and
        // 40 → 20 → 10 → 5 → 3 → 2) exercise the stride-2 edges.
        let x = Tensor::from_vec(values(2 * 3 * 48 * 40, 8), (2, 3, 48, 40), &Device::Cpu).unwrap();
        let fast = model.forward_chunk(&x, Backend::CpuKernels).unwrap();
        let plain = model.forward_chunk(&x, Backend::TensorOps).unwrap();
        assert_eq!(fast.grid.dims(), &[2, 2 * 2, MobileNetV2::FEATURE_DIM]);
        assert_eq!(plain.grid.dims(), fast.grid.dims());
        let scale = plain
            .grid
            .abs()
            .unwrap()
            .max_keepdim(2)
            .unwrap()
            .max(1)
            .unwrap();
        let scale = scale
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(
            scale > 0.1,
            "activations vanished ({scale}), the test would prove nothing"
        );
        let d = max_abs_diff(&fast.grid, &plain.grid);
        assert!(d < 1e-4 * scale, "grid differs by {d} (scale {scale})");
        assert!(max_abs_diff(&fast.pooled, &plain.pooled) < 1e-4 * scale);
    }

    #[test]
    fn batches_are_split_on_cpu_without_changing_results() {
        let model = synthetic_model();
        let b = 2 * CPU_CHUNK + 1;
        let x = Tensor::from_vec(values(b * 3 * 32 * 32, 9), (b, 3, 32, 32), &Device::Cpu).unwrap();
        let split = model.forward(&x).unwrap();
        let whole = model.forward_chunk(&x, Backend::CpuKernels).unwrap();
        assert_eq!(split.grid.dims(), &[b, 1, MobileNetV2::FEATURE_DIM]);
        assert_eq!(split.pooled.dims(), &[b, MobileNetV2::FEATURE_DIM]);
        assert!(max_abs_diff(&split.grid, &whole.grid) < 1e-5);
        assert!(max_abs_diff(&split.pooled, &whole.pooled) < 1e-5);
        assert_eq!(model.logits(&split.pooled).unwrap().dims(), &[b, CLASSES]);
    }

    /// The shared directory: `$NCCLEAN_SHARED`, else `../../shared` from
    /// this crate.
    fn shared_dir() -> PathBuf {
        match std::env::var_os("NCCLEAN_SHARED") {
            Some(dir) => PathBuf::from(dir),
            None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
        }
    }

    /// Loaded weights, or `None` (after saying why) when they are absent.
    fn load_or_skip(test: &str) -> Option<(PathBuf, MobileNetV2)> {
        let shared = shared_dir();
        let path = shared.join("models/mobilenet_v2/model.safetensors");
        if !path.is_file() {
            println!("{test}: skipped, no weights at {}", path.display());
            return None;
        }
        Some((shared, MobileNetV2::load(&path, &Device::Cpu).unwrap()))
    }

    /// How closely the reference must be met.
    #[derive(Clone, Copy, PartialEq)]
    enum Tolerance {
        /// Pixels decoded exactly as torchvision's PIL/libjpeg-turbo did:
        /// 1e-3 relative (1e-3 absolute near zero), top-5 in order.
        Exact,
        /// Pixels decoded by the image crate (zune-jpeg), which differ from
        /// libjpeg-turbo by up to 4 grey levels on ~10–25% of values; that
        /// moves features by up to ~3%. Loose, but still catches any wrong
        /// layer, which scrambles the classes.
        Decoder,
    }

    fn within(tol: Tolerance, what: &str, got: f64, want: f64) -> bool {
        let d = (got - want).abs();
        match tol {
            Tolerance::Exact => d <= 1e-3 * want.abs() || (want.abs() < 1e-2 && d <= 1e-3),
            Tolerance::Decoder if what.contains("pooled[") => d <= 0.05 * want.abs().max(0.5),
            Tolerance::Decoder => d <= 0.03 * want.abs(),
        }
    }

    /// Compare a forward pass on `pixels` (one image per reference case) with
    /// reference.json; returns the failures and the largest absolute and
    /// relative deviations.
    fn compare_with_reference(
        model: &MobileNetV2,
        cases: &[serde_json::Value],
        pixels: Vec<f32>,
        tol: Tolerance,
    ) -> (Vec<String>, f64, f64) {
        let x = Tensor::from_vec(pixels, (cases.len(), 3, 224, 224), &Device::Cpu).unwrap();
        let out = model.forward(&x).unwrap();
        assert_eq!(
            out.grid.dims(),
            &[cases.len(), MobileNetV2::GRID, MobileNetV2::FEATURE_DIM]
        );
        assert_eq!(out.pooled.dims(), &[cases.len(), MobileNetV2::FEATURE_DIM]);
        // The grid is the map that was pooled.
        let d = max_abs_diff(&out.grid.mean(1).unwrap(), &out.pooled);
        assert!(d < 1e-6, "pooled is not the grid mean ({d})");
        let logits: Vec<Vec<f32>> = model.logits(&out.pooled).unwrap().to_vec2().unwrap();
        let pooled: Vec<Vec<f32>> = out.pooled.to_vec2().unwrap();

        let (mut worst_abs, mut worst_rel) = (0f64, 0f64);
        let mut failures = Vec::new();
        let mut top_failures = Vec::new();
        let mut check = |what: String, got: f64, want: f64| {
            worst_abs = worst_abs.max((got - want).abs());
            if want.abs() >= 1e-2 {
                worst_rel = worst_rel.max((got - want).abs() / want.abs());
            }
            if !within(tol, &what, got, want) {
                failures.push(format!("{what}: got {got:.6}, want {want}"));
            }
        };
        for (i, case) in cases.iter().enumerate() {
            let name = case["image"].as_str().unwrap();
            let p: Vec<f64> = pooled[i].iter().map(|&v| f64::from(v)).collect();
            for (j, want) in case["pooled_first8"].as_array().unwrap().iter().enumerate() {
                check(format!("{name} pooled[{j}]"), p[j], want.as_f64().unwrap());
            }
            let norm = p.iter().map(|v| v * v).sum::<f64>().sqrt();
            check(
                format!("{name} l2"),
                norm,
                case["pooled_l2norm"].as_f64().unwrap(),
            );
            let mean = p.iter().sum::<f64>() / p.len() as f64;
            check(
                format!("{name} mean"),
                mean,
                case["pooled_mean"].as_f64().unwrap(),
            );

            let mut order: Vec<usize> = (0..logits[i].len()).collect();
            order.sort_by(|&a, &b| logits[i][b].total_cmp(&logits[i][a]));
            let want_top: Vec<usize> = case["top5_class_index"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            let top_ok = match tol {
                Tolerance::Exact => order[..5] == want_top[..],
                Tolerance::Decoder => {
                    order[0] == want_top[0]
                        && want_top.iter().filter(|c| order[..5].contains(c)).count() >= 4
                }
            };
            if !top_ok {
                top_failures.push(format!("{name} top-5 {:?}, want {want_top:?}", &order[..5]));
            }
            for (k, want) in case["top5_logit"].as_array().unwrap().iter().enumerate() {
                let got = f64::from(logits[i][want_top[k]]);
                check(
                    format!("{name} logit[{}]", want_top[k]),
                    got,
                    want.as_f64().unwrap(),
                );
            }
        }
        failures.extend(top_failures);
        (failures, worst_abs, worst_rel)
    }

    /// Reference cases and the encoded image files they name, or `None`
    /// (after saying why) when something is absent.
    fn reference_cases(shared: &Path, test: &str) -> Option<Vec<(serde_json::Value, Vec<u8>)>> {
        let ref_path = shared.join("models/mobilenet_v2/reference.json");
        let Ok(text) = std::fs::read_to_string(&ref_path) else {
            println!("{test}: skipped, no {}", ref_path.display());
            return None;
        };
        let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut cases = Vec::new();
        for case in reference["references"].as_array().unwrap() {
            let name = case["image"].as_str().unwrap();
            let img_path = shared.join("data/flickr8k/images").join(name);
            let Ok(bytes) = std::fs::read(&img_path) else {
                println!("{test}: skipped, no {}", img_path.display());
                return None;
            };
            cases.push((case.clone(), bytes));
        }
        Some(cases)
    }

    /// The full pipeline as used in production: image-crate decoding,
    /// ImageNet preprocessing, forward, classifier.
    #[test]
    fn reproduces_torchvision_reference() {
        let test = "reproduces_torchvision_reference";
        let Some((shared, model)) = load_or_skip(test) else {
            return;
        };
        let Some(cases) = reference_cases(&shared, test) else {
            return;
        };
        let prep = MobileNetV2::preprocess();
        let pixels = cases
            .iter()
            .flat_map(|(_, bytes)| prep.apply(bytes).unwrap())
            .collect();
        let cases: Vec<_> = cases.into_iter().map(|(case, _)| case).collect();
        let (failures, abs, rel) =
            compare_with_reference(&model, &cases, pixels, Tolerance::Decoder);
        println!("{test}: max deviation {abs:.2e} absolute, {rel:.2e} relative");
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// Binary PPM (P6, maxval 255) → RGB image.
    fn read_ppm(bytes: &[u8]) -> image::RgbImage {
        let mut fields = Vec::new();
        let mut pos = 0;
        while fields.len() < 4 {
            while bytes[pos].is_ascii_whitespace() {
                pos += 1;
            }
            if bytes[pos] == b'#' {
                while bytes[pos] != b'\n' {
                    pos += 1;
                }
                continue;
            }
            let start = pos;
            while !bytes[pos].is_ascii_whitespace() {
                pos += 1;
            }
            fields.push(std::str::from_utf8(&bytes[start..pos]).unwrap().to_string());
        }
        assert_eq!(
            (fields[0].as_str(), fields[3].as_str()),
            ("P6", "255"),
            "not a P6 PPM"
        );
        let (w, h) = (fields[1].parse().unwrap(), fields[2].parse().unwrap());
        image::RgbImage::from_raw(w, h, bytes[pos + 1..].to_vec()).unwrap()
    }

    /// The network alone, to the reference's precision. The image crate's
    /// JPEG decoder is not bit-exact with the libjpeg-turbo that produced
    /// reference.json, so this needs the images decoded by libjpeg-turbo as
    /// `<name without .jpg>.ppm` (e.g. `djpeg`, or PIL's `save("x.ppm")`) in
    /// the directory `$NCCLEAN_REFERENCE_PPM_DIR`; skipped without it.
    #[test]
    fn reproduces_torchvision_reference_exactly_from_libjpeg_pixels() {
        let test = "reproduces_torchvision_reference_exactly_from_libjpeg_pixels";
        let Some(ppm_dir) = std::env::var_os("NCCLEAN_REFERENCE_PPM_DIR").map(PathBuf::from) else {
            println!("{test}: skipped, NCCLEAN_REFERENCE_PPM_DIR is not set");
            return;
        };
        let Some((shared, model)) = load_or_skip(test) else {
            return;
        };
        let Some(cases) = reference_cases(&shared, test) else {
            return;
        };
        let prep = MobileNetV2::preprocess();
        let mut pixels = Vec::new();
        for (case, _) in &cases {
            let name = case["image"].as_str().unwrap();
            let stem = name.strip_suffix(".jpg").unwrap_or(name);
            let ppm = std::fs::read(ppm_dir.join(format!("{stem}.ppm"))).unwrap();
            pixels.extend(prep.apply_image(&image::DynamicImage::ImageRgb8(read_ppm(&ppm))));
        }
        let cases: Vec<_> = cases.into_iter().map(|(case, _)| case).collect();
        let (failures, abs, rel) = compare_with_reference(&model, &cases, pixels, Tolerance::Exact);
        println!("{test}: max deviation {abs:.2e} absolute, {rel:.2e} relative");
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn missing_key_is_named_with_the_file() {
        let mut tensors = HashMap::new();
        tensors.insert(
            "features.0.0.weight".to_string(),
            Tensor::zeros((32, 3, 3, 3), DType::F32, &Device::Cpu).unwrap(),
        );
        let w = Weights {
            tensors,
            source: "some/model.safetensors".into(),
            device: Device::Cpu,
            dtype: DType::F32,
        };
        let err = MobileNetV2::from_weights(&w).unwrap_err().to_string();
        assert!(err.contains("some/model.safetensors"), "{err}");
        assert!(err.contains("features.0.1.weight"), "{err}");
        let err = MobileNetV2::load(Path::new("/nonexistent/m.safetensors"), &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/m.safetensors"), "{err}");
    }

    /// Throughput on the real weights: `cargo test --release -p
    /// ncclean-models -- --ignored bench --nocapture`.
    #[test]
    #[ignore]
    fn bench_batch32() {
        let Some((_, model)) = load_or_skip("bench_batch32") else {
            return;
        };
        let batch = 32;
        let x = Tensor::from_vec(
            values(batch * 3 * 224 * 224, 6),
            (batch, 3, 224, 224),
            &Device::Cpu,
        )
        .unwrap();
        model.forward(&x).unwrap();
        // Best of several runs: other processes on a shared machine only
        // ever make a run slower.
        let runs: Vec<f64> = (0..5)
            .map(|_| {
                let start = std::time::Instant::now();
                model.forward(&x).unwrap();
                start.elapsed().as_secs_f64()
            })
            .collect();
        let best = runs.iter().copied().fold(f64::MAX, f64::min);
        let mean = runs.iter().sum::<f64>() / runs.len() as f64;
        println!(
            "bench_batch32: {:.1} images/s best, {:.1} mean ({:.3} s per batch of {batch}) \
             on {} threads",
            batch as f64 / best,
            batch as f64 / mean,
            best,
            candle_core::utils::get_num_threads()
        );
    }

    /// Why the depthwise convolution is hand-written: candle's grouped
    /// `conv2d` (on its native NCHW layout), the composed slices and the
    /// kernel on the widest layer shapes, 4 images each.
    #[test]
    #[ignore]
    fn bench_depthwise_variants() {
        let time = |f: &dyn Fn()| {
            f();
            (0..5)
                .map(|_| {
                    let t = std::time::Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::MAX, f64::min)
        };
        for (hw, c, stride) in [(112, 96, 2), (56, 144, 1), (14, 384, 1), (7, 960, 1)] {
            let dw = random_depthwise(c, stride);
            let nhwc =
                Tensor::from_vec(values(4 * hw * hw * c, 7), (4, hw, hw, c), &Device::Cpu).unwrap();
            let nchw = nhwc.permute((0, 3, 1, 2)).unwrap().contiguous().unwrap();
            let kernel = dw.weight.t().unwrap().reshape((c, 1, 3, 3)).unwrap();
            let grouped = time(&|| {
                nchw.conv2d(&kernel, 1, stride, 1, c).unwrap();
            });
            let composed = time(&|| {
                dw.forward_composed(&nhwc).unwrap();
            });
            let ours = time(&|| {
                dw.forward_cpu(&nhwc).unwrap();
            });
            println!(
                "bench_depthwise_variants {hw}x{hw}x{c}/{stride}: grouped conv2d {:.2} ms, \
                 composed {:.2} ms, kernel {:.2} ms",
                grouped * 1e3,
                composed * 1e3,
                ours * 1e3
            );
        }
    }
}
