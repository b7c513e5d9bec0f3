//! GGUF metadata values: the value type ids of the GGUF spec
//! (`docs/gguf.md`, "gguf_metadata_value_type"), the scalar [`MetaValue`] and
//! the typed [`MetaArray`], so that a 262144-entry token list is one
//! `Vec<String>` and its scores one `Vec<f32>`.
//!
//! Strings: GGUF says strings are UTF-8, and byte-level BPE vocabularies
//! (gpt2) are. SentencePiece vocabularies converted by older tools may hold raw
//! bytes, and a lossy conversion would corrupt those tokens. So a string that is
//! valid UTF-8 is stored as `String`; one that is not is kept byte for byte as
//! [`MetaValue::Bytes`], and a string array holding at least one such entry is
//! kept whole as [`MetaArray::StrBytes`]. [`MetaValue::as_bytes`] and
//! [`MetaArray::str_bytes`] read both forms.

use crate::formats::id_enum::id_enum;

id_enum! {
    /// A GGUF metadata value type id.
    pub enum ValueType {
        /// `GGUF_TYPE_UINT8`.
        U8 = 0,
        /// `GGUF_TYPE_INT8`.
        I8 = 1,
        /// `GGUF_TYPE_UINT16`.
        U16 = 2,
        /// `GGUF_TYPE_INT16`.
        I16 = 3,
        /// `GGUF_TYPE_UINT32`.
        U32 = 4,
        /// `GGUF_TYPE_INT32`.
        I32 = 5,
        /// `GGUF_TYPE_FLOAT32`.
        F32 = 6,
        /// `GGUF_TYPE_BOOL` (one byte, 0 or 1).
        Bool = 7,
        /// `GGUF_TYPE_STRING` (u64 length, then the bytes).
        Str = 8,
        /// `GGUF_TYPE_ARRAY` (element type, u64 count, then the elements).
        Array = 9,
        /// `GGUF_TYPE_UINT64`.
        U64 = 10,
        /// `GGUF_TYPE_INT64`.
        I64 = 11,
        /// `GGUF_TYPE_FLOAT64`.
        F64 = 12,
    }
}

impl ValueType {
    /// Short lower-case name (`u32`, `f32`, `str`, `array`), as `combs info` prints it.
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            Str => "str",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Encoded size of one value in bytes for fixed-size types, `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            Str | Array => None,
        }
    }

    /// The fewest bytes one value of this type can occupy in a file (a string
    /// is at least its 8-byte length, an array its type id and 8-byte count);
    /// bounds counts read from untrusted files.
    pub fn min_encoded_size(self) -> usize {
        match self {
            ValueType::Str => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        }
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float32`.
    F32(f32),
    /// `float64`.
    F64(f64),
    /// `bool`.
    Bool(bool),
    /// A string that is valid UTF-8.
    Str(String),
    /// A string that is not valid UTF-8, kept byte for byte.
    Bytes(Vec<u8>),
    /// A typed array.
    Array(MetaArray),
}

impl MetaValue {
    /// The GGUF type of the value ([`ValueType::Str`] for both string forms).
    pub fn value_type(&self) -> ValueType {
        match self {
            MetaValue::U8(_) => ValueType::U8,
            MetaValue::I8(_) => ValueType::I8,
            MetaValue::U16(_) => ValueType::U16,
            MetaValue::I16(_) => ValueType::I16,
            MetaValue::U32(_) => ValueType::U32,
            MetaValue::I32(_) => ValueType::I32,
            MetaValue::U64(_) => ValueType::U64,
            MetaValue::I64(_) => ValueType::I64,
            MetaValue::F32(_) => ValueType::F32,
            MetaValue::F64(_) => ValueType::F64,
            MetaValue::Bool(_) => ValueType::Bool,
            MetaValue::Str(_) | MetaValue::Bytes(_) => ValueType::Str,
            MetaValue::Array(_) => ValueType::Array,
        }
    }

    /// A readable type, with element type and length for arrays (`[f32; 262144]`).
    pub fn type_desc(&self) -> String {
        match self {
            MetaValue::Array(a) => a.type_desc(),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value of any integer type, widened; `None` for other types.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value of a float type as f64; `None` for other types.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, if the value is a valid UTF-8 string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The raw bytes of a string value, UTF-8 or not.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            MetaValue::Str(s) => Some(s.as_bytes()),
            MetaValue::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// The boolean, if the value is a `bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The array, if the value is one.
    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A metadata array: one vector of the element type.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaArray {
    /// `uint8` elements.
    U8(Vec<u8>),
    /// `int8` elements.
    I8(Vec<i8>),
    /// `uint16` elements.
    U16(Vec<u16>),
    /// `int16` elements.
    I16(Vec<i16>),
    /// `uint32` elements.
    U32(Vec<u32>),
    /// `int32` elements.
    I32(Vec<i32>),
    /// `uint64` elements.
    U64(Vec<u64>),
    /// `int64` elements.
    I64(Vec<i64>),
    /// `float32` elements.
    F32(Vec<f32>),
    /// `float64` elements.
    F64(Vec<f64>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// String elements, all valid UTF-8.
    Str(Vec<String>),
    /// String elements of which at least one is not valid UTF-8, kept byte for byte.
    StrBytes(Vec<Vec<u8>>),
    /// Nested arrays, each with its own element type.
    Array(Vec<MetaArray>),
}

/// Applies `$body` to the vector inside any variant of a [`MetaArray`].
macro_rules! each_variant {
    ($a:expr, $v:ident => $body:expr) => {
        match $a {
            MetaArray::U8($v) => $body,
            MetaArray::I8($v) => $body,
            MetaArray::U16($v) => $body,
            MetaArray::I16($v) => $body,
            MetaArray::U32($v) => $body,
            MetaArray::I32($v) => $body,
            MetaArray::U64($v) => $body,
            MetaArray::I64($v) => $body,
            MetaArray::F32($v) => $body,
            MetaArray::F64($v) => $body,
            MetaArray::Bool($v) => $body,
            MetaArray::Str($v) => $body,
            MetaArray::StrBytes($v) => $body,
            MetaArray::Array($v) => $body,
        }
    };
}

impl MetaArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        each_variant!(self, v => v.len())
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF type of the elements ([`ValueType::Str`] for both string forms).
    pub fn elem_type(&self) -> ValueType {
        match self {
            MetaArray::U8(_) => ValueType::U8,
            MetaArray::I8(_) => ValueType::I8,
            MetaArray::U16(_) => ValueType::U16,
            MetaArray::I16(_) => ValueType::I16,
            MetaArray::U32(_) => ValueType::U32,
            MetaArray::I32(_) => ValueType::I32,
            MetaArray::U64(_) => ValueType::U64,
            MetaArray::I64(_) => ValueType::I64,
            MetaArray::F32(_) => ValueType::F32,
            MetaArray::F64(_) => ValueType::F64,
            MetaArray::Bool(_) => ValueType::Bool,
            MetaArray::Str(_) | MetaArray::StrBytes(_) => ValueType::Str,
            MetaArray::Array(_) => ValueType::Array,
        }
    }

    /// A readable type with length: `[f32; 262144]`.
    pub fn type_desc(&self) -> String {
        format!("[{}; {}]", self.elem_type(), self.len())
    }

    /// The elements of a string array as raw bytes, whichever form it is stored in.
    pub fn str_bytes(&self) -> Option<Vec<&[u8]>> {
        match self {
            MetaArray::Str(v) => Some(v.iter().map(|s| s.as_bytes()).collect()),
            MetaArray::StrBytes(v) => Some(v.iter().map(|b| b.as_slice()).collect()),
            _ => None,
        }
    }

    /// The elements of an integer array, each converted to `T`; `None` when the
    /// array is not of an integer type, `Some(Err(index))` at the first element
    /// that does not fit in `T`.
    pub fn ints<T: TryFrom<i128>>(&self) -> Option<Result<Vec<T>, usize>> {
        fn conv<S: Copy + Into<i128>, T: TryFrom<i128>>(v: &[S]) -> Result<Vec<T>, usize> {
            v.iter()
                .enumerate()
                .map(|(i, &x)| T::try_from(x.into()).map_err(|_| i))
                .collect()
        }
        Some(match self {
            MetaArray::U8(v) => conv(v),
            MetaArray::I8(v) => conv(v),
            MetaArray::U16(v) => conv(v),
            MetaArray::I16(v) => conv(v),
            MetaArray::U32(v) => conv(v),
            MetaArray::I32(v) => conv(v),
            MetaArray::U64(v) => conv(v),
            MetaArray::I64(v) => conv(v),
            _ => return None,
        })
    }
}

macro_rules! from_scalar {
    ($($t:ty => $var:ident),* $(,)?) => {$(
        impl From<$t> for MetaValue {
            fn from(v: $t) -> Self {
                MetaValue::$var(v)
            }
        }
        impl From<Vec<$t>> for MetaArray {
            fn from(v: Vec<$t>) -> Self {
                MetaArray::$var(v)
            }
        }
        impl From<Vec<$t>> for MetaValue {
            fn from(v: Vec<$t>) -> Self {
                MetaValue::Array(MetaArray::$var(v))
            }
        }
    )*};
}

from_scalar!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, f32 => F32, f64 => F64, bool => Bool, String => Str,
);

impl From<&str> for MetaValue {
    fn from(v: &str) -> Self {
        MetaValue::Str(v.to_string())
    }
}

impl From<Vec<&str>> for MetaArray {
    fn from(v: Vec<&str>) -> Self {
        MetaArray::Str(v.into_iter().map(str::to_string).collect())
    }
}

impl From<Vec<&str>> for MetaValue {
    fn from(v: Vec<&str>) -> Self {
        MetaValue::Array(v.into())
    }
}

impl From<MetaArray> for MetaValue {
    fn from(v: MetaArray) -> Self {
        MetaValue::Array(v)
    }
}
