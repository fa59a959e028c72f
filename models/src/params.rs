//! Trainable parameters with seeded initialisation.
//!
//! candle's CPU random tensors cannot be seeded, so every trainable tensor is
//! created here from [`Rng`] values and registered in a [`VarMap`] under a
//! stable name. Loading a checkpoint later overwrites the values by name.

use candle_core::{DType, Device, Result, Shape, Tensor, Var};
use candle_nn::VarMap;

use crate::rng::Rng;

/// How a parameter tensor is initialised.
#[derive(Debug, Clone, Copy)]
pub enum Init {
    /// All zeros (biases).
    Zeros,
    /// Uniform in ±bound; see [`Init::default_for_fan_in`].
    Uniform { bound: f64 },
    /// Normal with the given standard deviation (embeddings).
    Normal { std: f64 },
}

impl Init {
    /// PyTorch's default for linear and conv layers (Kaiming-uniform with
    /// a = √5), which comes to a bound of 1/√fan_in.
    pub fn default_for_fan_in(fan_in: usize) -> Init {
        Init::Uniform {
            bound: 1.0 / (fan_in.max(1) as f64).sqrt(),
        }
    }
}

/// A named collection of trainable variables, created deterministically.
pub struct ParamStore {
    varmap: VarMap,
    rng: Rng,
    device: Device,
    prefix: Vec<String>,
}

impl ParamStore {
    /// An empty store; `seed` fixes every initial value.
    pub fn new(seed: u64, device: &Device) -> Self {
        ParamStore {
            varmap: VarMap::new(),
            rng: Rng::derive(seed, "init"),
            device: device.clone(),
            prefix: Vec::new(),
        }
    }

    /// The device parameters live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Run `f` with `name` pushed onto the name prefix (like `VarBuilder::pp`).
    pub fn scoped<T>(&mut self, name: &str, f: impl FnOnce(&mut Self) -> T) -> T {
        self.prefix.push(name.to_string());
        let out = f(self);
        self.prefix.pop();
        out
    }

    /// Create and register one variable.
    pub fn var(&mut self, name: &str, shape: impl Into<Shape>, init: Init) -> Result<Tensor> {
        let shape = shape.into();
        let n = shape.elem_count();
        let values: Vec<f32> = match init {
            Init::Zeros => vec![0.0; n],
            Init::Uniform { bound } => (0..n)
                .map(|_| ((self.rng.uniform() * 2.0 - 1.0) * bound) as f32)
                .collect(),
            Init::Normal { std } => (0..n).map(|_| (self.rng.normal() * std) as f32).collect(),
        };
        let t = Tensor::from_vec(values, shape, &self.device)?.to_dtype(DType::F32)?;
        let var = Var::from_tensor(&t)?;
        let full = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{}", self.prefix.join("."), name)
        };
        let mut data =
            self.varmap.data().lock().map_err(|_| {
                candle_core::Error::Msg("parameter store lock poisoned".to_string())
            })?;
        if data.contains_key(&full) {
            candle_core::bail!("parameter {full} defined twice");
        }
        let tensor = var.as_tensor().clone();
        data.insert(full, var);
        Ok(tensor)
    }

    /// The underlying var map (for optimisers and checkpoints).
    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    /// Consume the store, keeping the var map.
    pub fn into_varmap(self) -> VarMap {
        self.varmap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_gives_same_values_and_names_are_scoped() -> Result<()> {
        let make = |seed| -> Result<(Vec<f32>, Vec<String>)> {
            let mut p = ParamStore::new(seed, &Device::Cpu);
            let w = p.scoped("layer", |p| {
                p.var("weight", (2, 3), Init::default_for_fan_in(3))
            })?;
            p.var("bias", 2, Init::Zeros)?;
            let mut names: Vec<String> =
                p.varmap().data().lock().unwrap().keys().cloned().collect();
            names.sort();
            Ok((w.flatten_all()?.to_vec1()?, names))
        };
        let (a, names) = make(1)?;
        let (b, _) = make(1)?;
        let (c, _) = make(2)?;
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(names, vec!["bias".to_string(), "layer.weight".to_string()]);
        let bound = 1.0 / 3f32.sqrt();
        assert!(a.iter().all(|x| x.abs() <= bound));
        Ok(())
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let mut p = ParamStore::new(0, &Device::Cpu);
        assert!(p.var("w", 2, Init::Zeros).is_ok());
        assert!(p.var("w", 2, Init::Zeros).is_err());
    }
}
