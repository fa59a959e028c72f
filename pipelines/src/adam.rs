//! Adam whose moments can be saved and restored, so an interrupted `fit`
//! resumes exactly where it stopped.
//!
//! The arithmetic is candle's `AdamW` with `weight_decay = 0` (the papers'
//! Adam), operation for operation, so runs are identical to those made with
//! it (a test compares the two step by step). candle keeps its moments
//! private; here they are named after the parameters they belong to.
//!
//! [`Adam::step_host`] is the same update from gradients held as host
//! slices (the fused CPU head step, [`crate::fused_head`]): one pass over
//! each parameter, in place, instead of about ten tensor ops that each
//! allocate a parameter-sized result.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::{Result, Tensor, Var};
use candle_nn::VarMap;

use crate::host::{multiversion, with_values_mut};

const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const EPS: f64 = 1e-8;

/// One parameter with its first and second moments.
struct Slot {
    name: String,
    var: Var,
    m: Tensor,
    v: Tensor,
}

/// Adam (β = 0.9, 0.999, ε = 1e-8, no weight decay) over the parameters of
/// a [`VarMap`].
pub struct Adam {
    slots: Vec<Slot>,
    step_t: usize,
    lr: f64,
    /// Set when the moment tensors may share their storage with tensors
    /// outside (handed out by [`Adam::moments`], taken in by
    /// [`Adam::restore`]): [`Adam::step_host`] then copies them before it
    /// writes into them, so a saved checkpoint never changes under its
    /// writer.
    shared: AtomicBool,
}

impl Adam {
    /// Zero moments for every floating-point parameter of `vars`.
    pub fn new(vars: &VarMap, lr: f64) -> Result<Adam> {
        let data = vars
            .data()
            .lock()
            .map_err(|_| candle_core::Error::Msg("parameter map lock poisoned".into()))?;
        let mut slots = Vec::new();
        for (name, var) in data.iter().filter(|(_, v)| v.dtype().is_float()) {
            slots.push(Slot {
                name: name.clone(),
                var: var.clone(),
                m: var.as_tensor().zeros_like()?,
                v: var.as_tensor().zeros_like()?,
            });
        }
        // Name order: the saved state does not depend on hash-map order.
        slots.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Adam {
            slots,
            step_t: 0,
            lr,
            shared: AtomicBool::new(false),
        })
    }

    /// The parameters with their names, in the optimiser's (name) order:
    /// the order [`Adam::step_host`] takes gradients in.
    pub fn params(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.slots.iter().map(|s| (s.name.as_str(), &s.var))
    }

    /// Set the learning rate (schedules).
    pub fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    /// One update from the gradients in `grads`; parameters without a
    /// gradient keep their value and moments.
    pub fn step(&mut self, grads: &candle_core::backprop::GradStore) -> Result<()> {
        self.step_t += 1;
        let scale_m = 1f64 / (1f64 - BETA1.powi(self.step_t as i32));
        let scale_v = 1f64 / (1f64 - BETA2.powi(self.step_t as i32));
        for s in &mut self.slots {
            let Some(g) = grads.get(s.var.as_tensor()) else {
                continue;
            };
            // candle never detaches a variable's own gradient: a product's
            // weight gradient (activationᵀ · grad) still references the
            // batch's forward graph. Kept in the moments, every step's graph
            // would stay alive through the next step's moments (about 34 MB
            // a step on the demo towers, measured).
            let g = &g.detach();
            let m = ((&s.m * BETA1)? + (g * (1.0 - BETA1))?)?;
            let v = ((&s.v * BETA2)? + (g.sqr()? * (1.0 - BETA2))?)?;
            let m_hat = (&m * scale_m)?;
            let v_hat = (&v * scale_v)?;
            let adjusted = (m_hat / (v_hat.sqrt()? + EPS)?)?;
            let theta = (s.var.as_tensor() - (adjusted * self.lr)?)?;
            s.var.set(&theta)?;
            (s.m, s.v) = (m, v);
        }
        Ok(())
    }

    /// [`Adam::step`] from gradients on the host: `grads[i]` belongs to the
    /// `i`-th parameter of [`Adam::params`] (row-major, its full size),
    /// multiplied by `scale` first when given (the gradient-norm clip).
    /// Parameters and moments must be contiguous `f32` CPU tensors; they are
    /// updated in place. Element for element the arithmetic of
    /// [`Adam::step`] and of the clip in [`crate::net::Net::step`] (the same
    /// f32 operations on the same constants, `x · c + 0` where candle's
    /// affine op computes that), so equal gradients give bit-identical
    /// weights and moments (tested).
    pub fn step_host(&mut self, grads: &[Vec<f32>], scale: Option<f32>) -> Result<()> {
        if grads.len() != self.slots.len() {
            candle_core::bail!(
                "adam: {} gradients for {} parameters",
                grads.len(),
                self.slots.len()
            );
        }
        if self.shared.swap(false, Ordering::Relaxed) {
            for s in &mut self.slots {
                s.m = s.m.copy()?;
                s.v = s.v.copy()?;
            }
        }
        self.step_t += 1;
        let k = AdamConsts {
            beta1: BETA1 as f32,
            one_minus_beta1: (1.0 - BETA1) as f32,
            beta2: BETA2 as f32,
            one_minus_beta2: (1.0 - BETA2) as f32,
            scale_m: (1f64 / (1f64 - BETA1.powi(self.step_t as i32))) as f32,
            scale_v: (1f64 / (1f64 - BETA2.powi(self.step_t as i32))) as f32,
            eps: EPS as f32,
            lr: self.lr as f32,
            clip: scale,
        };
        for (s, g) in self.slots.iter().zip(grads) {
            if s.var.elem_count() != g.len() {
                candle_core::bail!(
                    "adam: a gradient of {} values for {} of {}",
                    g.len(),
                    s.name,
                    s.var.elem_count()
                );
            }
            // Each level is one tensor's storage, locked for writing while
            // its closure runs; `?` once per level.
            with_values_mut(s.var.as_tensor(), |w| {
                with_values_mut(&s.m, |m| {
                    with_values_mut(&s.v, |v| adam_update_parallel(w, m, v, g, &k))
                })
            })???;
        }
        Ok(())
    }

    /// A step in which no parameter has a gradient (a batch without
    /// negatives): counted, nothing moves, as [`Adam::step`] does with a
    /// gradient store that holds none of the parameters.
    pub fn step_host_without_gradients(&mut self) {
        self.step_t += 1;
    }

    /// Steps taken so far.
    pub fn steps(&self) -> usize {
        self.step_t
    }

    /// The moments, as `m.<param>` and `v.<param>` tensors.
    pub fn moments(&self) -> Vec<(String, Tensor)> {
        self.shared.store(true, Ordering::Relaxed);
        let mut out = Vec::with_capacity(2 * self.slots.len());
        for s in &self.slots {
            out.push((format!("m.{}", s.name), s.m.clone()));
            out.push((format!("v.{}", s.name), s.v.clone()));
        }
        out
    }

    /// Restore [`Adam::moments`] and the step count. Every parameter's
    /// moments must be present with its shape.
    pub fn restore(&mut self, steps: usize, moments: &HashMap<String, Tensor>) -> Result<()> {
        for s in &mut self.slots {
            for (prefix, slot) in [("m", &mut s.m), ("v", &mut s.v)] {
                let key = format!("{prefix}.{}", s.name);
                let t = moments.get(&key).ok_or_else(|| {
                    candle_core::Error::Msg(format!("optimiser state has no {key}"))
                })?;
                if t.shape() != slot.shape() {
                    candle_core::bail!(
                        "optimiser state {key} has shape {:?}, expected {:?}",
                        t.shape(),
                        slot.shape()
                    );
                }
                *slot = t.to_device(slot.device())?.to_dtype(slot.dtype())?;
            }
        }
        self.step_t = steps;
        self.shared.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// The constants of one Adam step, as the f32 values candle's affine ops
/// apply them.
struct AdamConsts {
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    scale_m: f32,
    scale_v: f32,
    eps: f32,
    lr: f32,
    /// The clip factor, when the gradient norm was clipped.
    clip: Option<f32>,
}

/// Below this many values a parameter is updated on one thread.
const PARALLEL_MIN: usize = 1 << 15;

/// [`adam_update`] with a large parameter cut in two halves, one per
/// thread of rayon's pool: the pass is bound by memory traffic (four
/// arrays read, three written), which two cores share better than one.
/// Each element's arithmetic is unchanged.
fn adam_update_parallel(w: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: &AdamConsts) {
    if w.len() < PARALLEL_MIN || rayon::current_num_threads() < 2 {
        return adam_update(w, m, v, g, k);
    }
    let half = w.len() / 2;
    let (w0, w1) = w.split_at_mut(half);
    let (m0, m1) = m.split_at_mut(half);
    let (v0, v1) = v.split_at_mut(half);
    let (g0, g1) = g.split_at(half);
    rayon::join(
        || adam_update(w0, m0, v0, g0, k),
        || adam_update(w1, m1, v1, g1, k),
    );
}

multiversion! {
    /// One Adam update of a parameter `w` with moments `m`, `v` from its
    /// gradient `g`, in place.
    fn adam_update(w: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: &AdamConsts) => adam_update_impl
}

#[inline(always)]
fn adam_update_impl(w: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: &AdamConsts) {
    // Two loops, so that neither branches on the clip per element.
    match k.clip {
        Some(c) => adam_loop::<true>(w, m, v, g, k, c),
        None => adam_loop::<false>(w, m, v, g, k, 1.0),
    }
}

/// Each line is one op of [`Adam::step`] (and, when `CLIPPED`, of the clip
/// in [`crate::net::Net::step`]) on one element: candle's `t * c` is the
/// affine op `t · c + 0`, `t + c` is `t · 1 + c`. (`+ 0.0` turns a −0 into
/// +0 and `· 1.0` changes nothing; they are kept so that each line reads as
/// the op it mirrors.)
#[inline(always)]
#[allow(clippy::identity_op)]
fn adam_loop<const CLIPPED: bool>(
    w: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
    k: &AdamConsts,
    clip: f32,
) {
    let n = w.len().min(m.len()).min(v.len()).min(g.len());
    let (w, m, v, g) = (&mut w[..n], &mut m[..n], &mut v[..n], &g[..n]);
    for i in 0..n {
        let g = if CLIPPED { g[i] * clip + 0.0 } else { g[i] };
        let mi = (m[i] * k.beta1 + 0.0) + (g * k.one_minus_beta1 + 0.0);
        let vi = (v[i] * k.beta2 + 0.0) + ((g * g) * k.one_minus_beta2 + 0.0);
        let m_hat = mi * k.scale_m + 0.0;
        let v_hat = vi * k.scale_v + 0.0;
        let adjusted = m_hat / (v_hat.sqrt() * 1.0 + k.eps);
        w[i] -= adjusted * k.lr + 0.0;
        m[i] = mi;
        v[i] = vi;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_nn::{AdamW, Optimizer, ParamsAdamW};

    /// A parameter map with one 3×4 parameter `w` = sin(0..12).
    fn varmap() -> Result<VarMap> {
        let vm = VarMap::new();
        let vb = candle_nn::VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
        vb.get_with_hints((3, 4), "w", candle_nn::Init::Const(0.0))?;
        let t = Tensor::arange(0f32, 12.0, &Device::Cpu)?
            .reshape((3, 4))?
            .sin()?;
        vm.all_vars()[0].set(&t)?;
        Ok(vm)
    }

    fn loss(vm: &VarMap) -> Result<Tensor> {
        let vars = vm.all_vars();
        let w = vars[0].as_tensor();
        (w.sqr()?.sum_all()? + w.sin()?.sum_all()?)? * 0.5
    }

    #[test]
    fn matches_candle_adamw_bit_for_bit_and_resumes_exactly() -> Result<()> {
        let (a, b) = (varmap()?, varmap()?);
        let mut ours = Adam::new(&a, 1e-2)?;
        let params = ParamsAdamW {
            lr: 1e-2,
            weight_decay: 0.0,
            ..ParamsAdamW::default()
        };
        let mut theirs = AdamW::new(b.all_vars(), params)?;
        for step in 0..20 {
            if step == 10 {
                ours.set_lr(3e-3);
                theirs.set_learning_rate(3e-3);
            }
            ours.step(&loss(&a)?.backward()?)?;
            theirs.step(&loss(&b)?.backward()?)?;
            let (x, y): (Vec<f32>, Vec<f32>) = (
                a.all_vars()[0].flatten_all()?.to_vec1()?,
                b.all_vars()[0].flatten_all()?.to_vec1()?,
            );
            assert_eq!(x, y, "step {step}");
        }
        // Save after 20 steps, restore into a fresh optimiser over a copy of
        // the parameters: the next steps are identical.
        let c = varmap()?;
        c.all_vars()[0].set(a.all_vars()[0].as_tensor())?;
        let mut resumed = Adam::new(&c, 3e-3)?;
        let saved: HashMap<String, Tensor> = ours.moments().into_iter().collect();
        resumed.restore(ours.steps(), &saved)?;
        for _ in 0..5 {
            ours.step(&loss(&a)?.backward()?)?;
            resumed.step(&loss(&c)?.backward()?)?;
        }
        let x: Vec<f32> = a.all_vars()[0].flatten_all()?.to_vec1()?;
        let y: Vec<f32> = c.all_vars()[0].flatten_all()?.to_vec1()?;
        assert_eq!(x, y);
        assert!(resumed.restore(1, &HashMap::new()).is_err());
        Ok(())
    }

    /// `step_host` against `step` on the same gradients (those of `a`,
    /// whose parameters stay equal to `b`'s), with the clip's
    /// scaling applied as `Net::step` applies it (`g · f + 0`): bit for bit,
    /// and the moments handed out before a step keep their values.
    #[test]
    fn host_step_is_bit_identical_to_the_tensor_step() -> Result<()> {
        let (a, b) = (varmap()?, varmap()?);
        let mut tensor = Adam::new(&a, 1e-2)?;
        let mut host = Adam::new(&b, 1e-2)?;
        for step in 0..12 {
            let scale = (step % 3 == 1).then_some(0.37f32);
            let mut grads = loss(&a)?.backward()?;
            let w = a.all_vars().remove(0);
            let g = grads.remove(w.as_tensor()).expect("grad");
            let host_g: Vec<f32> = g.flatten_all()?.to_vec1()?;
            if let Some(f) = scale {
                let f = Tensor::new(f, &Device::Cpu)?;
                let zero = Tensor::new(0f32, &Device::Cpu)?;
                grads.insert(w.as_tensor(), g.broadcast_mul(&f)?.broadcast_add(&zero)?);
            } else {
                grads.insert(w.as_tensor(), g);
            }
            let saved = host.moments();
            let before: Vec<f32> = saved[0].1.flatten_all()?.to_vec1()?;
            tensor.step(&grads)?;
            host.step_host(&[host_g], scale)?;
            let after: Vec<f32> = saved[0].1.flatten_all()?.to_vec1()?;
            assert_eq!(before, after, "step {step}: a saved moment changed");
            let bits = |vm: &VarMap| -> Result<Vec<u32>> {
                Ok(vm.all_vars()[0]
                    .flatten_all()?
                    .to_vec1::<f32>()?
                    .into_iter()
                    .map(f32::to_bits)
                    .collect())
            };
            assert_eq!(bits(&a)?, bits(&b)?, "step {step}");
            let moments = |o: &Adam| -> Result<Vec<Vec<f32>>> {
                o.moments()
                    .iter()
                    .map(|(_, t)| t.flatten_all()?.to_vec1())
                    .collect()
            };
            assert_eq!(moments(&tensor)?, moments(&host)?, "step {step}");
        }
        assert!(host.step_host(&[vec![0.0; 3]], None).is_err());
        Ok(())
    }

    #[test]
    fn moments_hold_no_graph_of_the_step() -> Result<()> {
        // loss = Σ (w ⊙ w): candle hands w the gradient w + w, built from
        // the variable itself and so still part of a graph. The moments
        // must keep values only, or each step's graph lives on in the next.
        let vm = varmap()?;
        let mut opt = Adam::new(&vm, 1e-2)?;
        let w = vm.all_vars().remove(0);
        let grads = (w.as_tensor() * w.as_tensor())?.sum_all()?.backward()?;
        assert!(grads.get(w.as_tensor()).expect("grad").track_op());
        opt.step(&grads)?;
        for (name, m) in opt.moments() {
            assert!(!m.track_op(), "{name} holds a graph");
        }
        Ok(())
    }
}
