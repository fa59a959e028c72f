//! Run-time CPU dispatch for plain loops, shared by the CPU kernels of
//! this crate (MiniLM's encoder, `distinct`'s hashing) and of the
//! pipelines crate (the fused head step, Adam).

/// `fn NAME(args) => IMPL`: a function that runs the `#[inline(always)]`
/// kernel `IMPL` compiled for AVX2+FMA when the CPU has them, else the
/// baseline build. The crate is built for baseline x86-64, where plain
/// loops vectorise 4 wide; with this they run 8 wide where the CPU can.
/// (FMA is only enabled, never requested: Rust does not contract `a * b + c`,
/// so results are the same on either path.)
#[macro_export]
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? => $imp:ident) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                fn wide($($arg: $ty),*) $(-> $ret)? {
                    $imp($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the CPU has the features `wide` is built for.
                    return unsafe { wide($($arg),*) };
                }
            }
            $imp($($arg),*)
        }
    };
}
