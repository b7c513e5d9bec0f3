//! Code-point classes and the GPT-2 byte alphabet, as llama.cpp's
//! `src/unicode.cpp` defines them (`unicode_cpt_flags_from_cpt`,
//! `unicode_byte_to_utf8`, `unicode_utf8_to_byte`).
//!
//! llama.cpp classifies each code point by its Unicode general category
//! (one flag per major class) plus a whitespace bit from the `White_Space`
//! property. Its table was generated from Unicode 15.1; the
//! `unicode-general-category` crate follows Unicode 16.0, so the code points
//! assigned in 16.0 are reported as unassigned here, exactly as llama.cpp does.

use std::borrow::Cow;

use unicode_general_category::{GeneralCategory as G, get_general_category};

/// Classes of one code point (`unicode_cpt_flags` in llama.cpp).
///
/// The value 0 stands for "no code point" (a position outside the current
/// segment), which the hand-written splitters test with `is_empty`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CptFlags(u16);

impl CptFlags {
    pub(crate) const UNDEFINED: u16 = 0x0001;
    pub(crate) const NUMBER: u16 = 0x0002;
    pub(crate) const LETTER: u16 = 0x0004;
    pub(crate) const SEPARATOR: u16 = 0x0008;
    pub(crate) const MARK: u16 = 0x0010;
    pub(crate) const PUNCTUATION: u16 = 0x0020;
    pub(crate) const SYMBOL: u16 = 0x0040;
    pub(crate) const CONTROL: u16 = 0x0080;
    const MASK_CATEGORIES: u16 = 0x00FF;
    pub(crate) const WHITESPACE: u16 = 0x0100;

    /// No flags at all: a position outside the segment being split.
    pub(crate) const NONE: CptFlags = CptFlags(0);

    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }
    pub(crate) fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub(crate) fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub(crate) fn is_mark(self) -> bool {
        self.0 & Self::MARK != 0
    }
    pub(crate) fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    /// The category bits alone (one of the eight class flags).
    pub(crate) fn category(self) -> u16 {
        self.0 & Self::MASK_CATEGORIES
    }
}

/// Code points with the `White_Space` property (llama.cpp's `unicode_set_whitespace`).
const WHITESPACE: [u32; 25] = [
    0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
    0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000,
];

/// Ranges (inclusive) of code points first assigned in Unicode 16.0, which
/// llama.cpp's Unicode 15.1 table still reports as unassigned.
const NEW_IN_UNICODE_16: [(u32, u32); 47] = [
    (0x00897, 0x00897),
    (0x01B4E, 0x01B4F),
    (0x01B7F, 0x01B7F),
    (0x01C89, 0x01C8A),
    (0x02427, 0x02429),
    (0x031E4, 0x031E5),
    (0x0A7CB, 0x0A7CD),
    (0x0A7DA, 0x0A7DC),
    (0x105C0, 0x105F3),
    (0x10D40, 0x10D65),
    (0x10D69, 0x10D85),
    (0x10D8E, 0x10D8F),
    (0x10EC2, 0x10EC4),
    (0x10EFC, 0x10EFC),
    (0x11380, 0x11389),
    (0x1138B, 0x1138B),
    (0x1138E, 0x1138E),
    (0x11390, 0x113B5),
    (0x113B7, 0x113C0),
    (0x113C2, 0x113C2),
    (0x113C5, 0x113C5),
    (0x113C7, 0x113CA),
    (0x113CC, 0x113D5),
    (0x113D7, 0x113D8),
    (0x113E1, 0x113E2),
    (0x116D0, 0x116E3),
    (0x11BC0, 0x11BE1),
    (0x11BF0, 0x11BF9),
    (0x11F5A, 0x11F5A),
    (0x13460, 0x143FA),
    (0x16100, 0x16139),
    (0x16D40, 0x16D79),
    (0x18CFF, 0x18CFF),
    (0x1CC00, 0x1CCF9),
    (0x1CD00, 0x1CEB3),
    (0x1E5D0, 0x1E5FA),
    (0x1E5FF, 0x1E5FF),
    (0x1F8B2, 0x1F8BB),
    (0x1F8C0, 0x1F8C1),
    (0x1FA89, 0x1FA89),
    (0x1FA8F, 0x1FA8F),
    (0x1FABE, 0x1FABE),
    (0x1FAC6, 0x1FAC6),
    (0x1FADC, 0x1FADC),
    (0x1FADF, 0x1FADF),
    (0x1FAE9, 0x1FAE9),
    (0x1FBCB, 0x1FBEF),
];

/// Flags of the 128 ASCII code points, computed once at compile time.
const ASCII_FLAGS: [u16; 128] = ascii_flags();

const fn ascii_flags() -> [u16; 128] {
    let mut t = [0u16; 128];
    let mut c = 0usize;
    while c < 128 {
        let b = c as u8;
        t[c] = if b < 0x20 || b == 0x7F {
            CptFlags::CONTROL
        } else if b == b' ' {
            CptFlags::SEPARATOR
        } else if b.is_ascii_digit() {
            CptFlags::NUMBER
        } else if b.is_ascii_alphabetic() {
            CptFlags::LETTER
        } else if matches!(
            b,
            b'$' | b'+' | b'<' | b'=' | b'>' | b'^' | b'`' | b'|' | b'~'
        ) {
            CptFlags::SYMBOL
        } else {
            CptFlags::PUNCTUATION
        };
        if matches!(b, 0x09..=0x0D | b' ') {
            t[c] |= CptFlags::WHITESPACE;
        }
        c += 1;
    }
    t
}

fn category_flag(c: char) -> u16 {
    let cp = c as u32;
    if NEW_IN_UNICODE_16
        .binary_search_by(|&(lo, hi)| {
            if hi < cp {
                std::cmp::Ordering::Less
            } else if lo > cp {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
    {
        return CptFlags::UNDEFINED;
    }
    match get_general_category(c) {
        G::Control | G::Format | G::PrivateUse | G::Surrogate => CptFlags::CONTROL,
        G::LowercaseLetter
        | G::ModifierLetter
        | G::OtherLetter
        | G::TitlecaseLetter
        | G::UppercaseLetter => CptFlags::LETTER,
        G::SpacingMark | G::EnclosingMark | G::NonspacingMark => CptFlags::MARK,
        G::DecimalNumber | G::LetterNumber | G::OtherNumber => CptFlags::NUMBER,
        G::ConnectorPunctuation
        | G::DashPunctuation
        | G::ClosePunctuation
        | G::FinalPunctuation
        | G::InitialPunctuation
        | G::OtherPunctuation
        | G::OpenPunctuation => CptFlags::PUNCTUATION,
        G::CurrencySymbol | G::ModifierSymbol | G::MathSymbol | G::OtherSymbol => CptFlags::SYMBOL,
        G::LineSeparator | G::ParagraphSeparator | G::SpaceSeparator => CptFlags::SEPARATOR,
        // Unassigned, and any category a later crate version may add.
        _ => CptFlags::UNDEFINED,
    }
}

/// Flags of one code point (`unicode_cpt_flags_from_cpt`).
pub(crate) fn flags(c: char) -> CptFlags {
    let cp = c as u32;
    if cp < 128 {
        return CptFlags(ASCII_FLAGS[cp as usize]);
    }
    let mut f = category_flag(c);
    if WHITESPACE.binary_search(&cp).is_ok() {
        f |= CptFlags::WHITESPACE;
    }
    CptFlags(f)
}

/// ASCII-only lower-casing: the only use is the `(?i:'s|'t|…)` contractions,
/// and no non-ASCII code point lower-cases to one of their ASCII letters.
pub(crate) fn to_lower_ascii(c: char) -> char {
    c.to_ascii_lowercase()
}

/// The GPT-2 byte alphabet: byte `b` is written as code point `BYTE_TO_CHAR[b]`.
pub(crate) static BYTE_TO_CHAR: [char; 256] = byte_to_char_table();

const fn byte_to_char_table() -> [char; 256] {
    let mut t = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        let cp = if printable {
            b as u32
        } else {
            n += 1;
            255 + n
        };
        t[b] = match char::from_u32(cp) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    t
}

/// Inverse of [`BYTE_TO_CHAR`], indexed by code point (`u16::MAX`: not in the alphabet).
static CHAR_TO_BYTE: [u16; 324] = char_to_byte_table();

const fn char_to_byte_table() -> [u16; 324] {
    let fwd = byte_to_char_table();
    let mut t = [u16::MAX; 324];
    let mut b = 0usize;
    while b < 256 {
        t[fwd[b] as usize] = b as u16;
        b += 1;
    }
    t
}

/// The byte a code point of the GPT-2 alphabet stands for (`unicode_utf8_to_byte`).
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    match CHAR_TO_BYTE.get(c as usize) {
        Some(&b) if b != u16::MAX => Some(b as u8),
        _ => None,
    }
}

/// Bytes as text the way llama.cpp's `unicode_cpts_from_utf8` reads them:
/// every byte that does not start a valid character becomes U+FFFD.
pub(crate) fn str_lossy(bytes: &[u8]) -> Cow<'_, str> {
    let first = match std::str::from_utf8(bytes) {
        Ok(s) => return Cow::Borrowed(s),
        Err(e) => e,
    };
    let mut out = String::with_capacity(bytes.len() + 2);
    let mut rest = bytes;
    let mut err = Some(first);
    while let Some(e) = err {
        let (valid, tail) = rest.split_at(e.valid_up_to());
        out.push_str(std::str::from_utf8(valid).unwrap_or_default());
        out.push(char::REPLACEMENT_CHARACTER);
        rest = &tail[1..];
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                err = None;
            }
            Err(e) => err = Some(e),
        }
    }
    Cow::Owned(out)
}

/// Length of the UTF-8 sequence a lead byte announces (`unicode_len_utf8`);
/// continuation and invalid bytes count as 1.
pub(crate) fn utf8_len(lead: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(lead >> 4) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(BYTE_TO_CHAR[b as usize]), Some(b));
        }
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(char_to_byte('a'), Some(b'a'));
        assert_eq!(char_to_byte('\u{3000}'), None);
    }

    #[test]
    fn str_lossy_replaces_each_bad_byte() {
        assert_eq!(str_lossy(b"ab"), "ab");
        assert_eq!(str_lossy(b"a\xE0\xA0x\xFF"), "a\u{FFFD}\u{FFFD}x\u{FFFD}");
        assert_eq!(str_lossy(b"\xF0\x9F\x98"), "\u{FFFD}\u{FFFD}\u{FFFD}");
    }

    #[test]
    fn flags_match_categories() {
        assert!(flags('a').is_letter());
        assert!(flags('é').is_letter());
        assert!(flags('日').is_letter());
        assert!(flags('٣').is_number());
        assert!(flags('\u{301}').is_mark());
        assert!(flags(' ').is_whitespace());
        assert!(flags('\u{3000}').is_whitespace());
        assert_eq!(flags('\u{1FAE9}').category(), CptFlags::UNDEFINED);
        assert_eq!(flags('😀').category(), CptFlags::SYMBOL);
        assert_eq!(flags('!').category(), CptFlags::PUNCTUATION);
        assert_eq!(flags('$').category(), CptFlags::SYMBOL);
    }
}
