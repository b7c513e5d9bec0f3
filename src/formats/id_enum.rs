//! [`id_enum!`]: the enums of file-format ids (GGML tensor types, GGUF value
//! types, llama.cpp file types), each id written once.

/// Declares a `#[repr(u32)]` enum whose discriminants are the ids a file
/// format gives its variants, with `ALL` (every variant, in declaration
/// order), `from_id` and `id` derived from the one list.
macro_rules! id_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $id:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u32)]
        $vis enum $name {
            $($(#[$vmeta])* $variant = $id,)*
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: [$name; [$($id),*].len()] = [$($name::$variant),*];

            /// The variant with id `id`, `None` for ids it does not list.
            pub fn from_id(id: u32) -> Option<Self> {
                match id {
                    $($id => Some($name::$variant),)*
                    _ => None,
                }
            }

            /// The id, as the file stores it.
            pub fn id(self) -> u32 {
                self as u32
            }
        }
    };
}

pub(crate) use id_enum;
