//! `names!`: the lowercase names of the enums configuration and status spell
//! out (`ALL`, `as_str`, `Display`), written once for every layer.

macro_rules! names {
    ($($ty:ident { $($variant:ident => $name:literal),+ $(,)? })+) => {$(
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The lowercase name used in configuration.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )+};
}
