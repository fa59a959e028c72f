//! Range checks of method parameters (`[params]`): each error is a
//! [`Error::Config`] that names the key, the accepted range and the value.

use crate::error::{Error, Result};

/// `params.name` must be a finite number > 0 (temperatures, scales).
pub fn positive(name: &str, v: f64) -> Result<()> {
    check(v.is_finite() && v > 0.0, name, "a number > 0", v)
}

/// `params.name` must be a finite number ≥ 0 (weights, margins).
pub fn non_negative(name: &str, v: f64) -> Result<()> {
    check(v.is_finite() && v >= 0.0, name, "a number ≥ 0", v)
}

/// `params.name` must lie in [0, 1] (momenta, thresholds, fractions).
pub fn unit_interval(name: &str, v: f64) -> Result<()> {
    check((0.0..=1.0).contains(&v), name, "in [0, 1]", v)
}

fn check(ok: bool, name: &str, range: &str, v: f64) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "params.{name} must be {range}, got {v}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_messages() {
        assert!(positive("tau", 0.05).is_ok());
        assert!(non_negative("gamma", 0.0).is_ok());
        assert!(unit_interval("beta", 1.0).is_ok());
        for bad in [
            positive("tau", 0.0),
            positive("tau", f64::NAN),
            non_negative("g", -1e-9),
        ] {
            assert!(matches!(bad, Err(Error::Config(_))));
        }
        assert!(non_negative("gamma", f64::INFINITY).is_err());
        let e = unit_interval("beta", 1.5).unwrap_err().to_string();
        assert_eq!(e, "params.beta must be in [0, 1], got 1.5");
        assert!(unit_interval("beta", f64::NAN).is_err());
    }
}
