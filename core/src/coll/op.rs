//! Reduction operations.

use bytemuck::Pod;

/// Element types that the built-in reductions know. Integer sums and products wrap.
pub trait Reduce: Pod + PartialOrd {
    /// `a + b`.
    fn add(a: Self, b: Self) -> Self;
    /// `a * b`.
    fn mul(a: Self, b: Self) -> Self;
}

macro_rules! reduce_int {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            fn mul(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
        }
    )*};
}
reduce_int!(i8, i16, i32, i64, u8, u16, u32, u64, isize, usize);

impl Reduce for f32 {
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
    fn mul(a: Self, b: Self) -> Self {
        a * b
    }
}

impl Reduce for f64 {
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
    fn mul(a: Self, b: Self) -> Self {
        a * b
    }
}

/// A reduction: built-in, or a user function that must be associative and
/// commutative (the algorithms combine partial results in tree and ring order).
#[derive(Clone, Copy)]
pub enum Op<'a, T> {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// `f(input, inout)` sets `inout[i] = input[i] (op) inout[i]`.
    User(&'a dyn Fn(&[T], &mut [T])),
}

impl<T> std::fmt::Debug for Op<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sum => "Sum",
            Self::Prod => "Prod",
            Self::Min => "Min",
            Self::Max => "Max",
            Self::User(_) => "User",
        })
    }
}

impl<T: Reduce> Op<'_, T> {
    /// `inout[i] = input[i] (op) inout[i]`.
    pub fn apply(&self, input: &[T], inout: &mut [T]) {
        debug_assert_eq!(input.len(), inout.len());
        match self {
            Self::Sum => inout.iter_mut().zip(input).for_each(|(o, &i)| *o = T::add(i, *o)),
            Self::Prod => inout.iter_mut().zip(input).for_each(|(o, &i)| *o = T::mul(i, *o)),
            Self::Min => inout.iter_mut().zip(input).for_each(|(o, &i)| {
                if i < *o {
                    *o = i;
                }
            }),
            Self::Max => inout.iter_mut().zip(input).for_each(|(o, &i)| {
                if i > *o {
                    *o = i;
                }
            }),
            Self::User(f) => f(input, inout),
        }
    }
}
