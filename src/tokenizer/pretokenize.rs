//! Pre-tokenizers of byte-level BPE vocabularies: the regex list each
//! `tokenizer.ggml.pre` value selects (llama.cpp's `llm_tokenizer_bpe`
//! constructor and the pre-type switch in `llama_vocab::impl::load`) and the
//! splitting of text into words (`unicode_regex_split` in `src/unicode.cpp`).
//!
//! Each regex of the list splits every segment the previous ones produced.
//! The common GPT-2, Llama-3, Qwen2 and Qwen3.5 patterns are matched by hand
//! written scanners that reproduce llama.cpp's own; any other pattern runs
//! through `fancy-regex` on the same "collapsed" text llama.cpp feeds to
//! `std::regex`: every code point outside ASCII replaced by one stand-in per
//! Unicode class, and `\p{..}` in the pattern replaced by that stand-in plus
//! the ASCII members of the class.

use super::pretype::{GPT2, LLAMA3, NEWLINES, QWEN2, QWEN35, pre_spec};
use super::unicode::{self, BYTE_TO_CHAR, CptFlags};
use crate::error::{ModelError, Result};

/// How one regex of the list is matched.
#[derive(Debug)]
enum Splitter {
    Gpt2,
    /// Llama-3 family scanner: digits grouped by `digits`, marks part of words.
    Llama3 {
        digits: usize,
        marks: bool,
    },
    Newlines,
    Regex {
        re: fancy_regex::Regex,
        collapsed: bool,
    },
}

/// The pre-tokenizer of a byte-level BPE vocabulary.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    splitters: Vec<Splitter>,
    needs_collapse: bool,
    /// `clean_spaces` of llama.cpp: tidy spaces before punctuation when decoding.
    pub(crate) clean_spaces: bool,
    /// Whole words found in the vocabulary skip the merges.
    pub(crate) ignore_merges: bool,
    /// The pre type turns `add_bos` on (before the GGUF key may turn it off).
    pub(crate) add_bos: bool,
    /// The pre type has no default BOS token.
    pub(crate) no_bos: bool,
}

/// Stand-in for non-ASCII code points of a class in the collapsed text.
fn collapsed_char(f: CptFlags) -> char {
    const BASE: u32 = 0xE0D0;
    let off = match f.category() {
        CptFlags::NUMBER => 1,
        CptFlags::LETTER => 2,
        CptFlags::PUNCTUATION => 3,
        CptFlags::MARK => 4,
        CptFlags::SYMBOL => 5,
        _ => 0,
    };
    char::from_u32(BASE + off).unwrap_or('\u{E0D0}')
}

/// The class of a `\p{..}` name in a collapsed pattern: stand-in plus ASCII members.
fn collapsed_class(name: &str) -> Option<&'static str> {
    Some(match name {
        "N" => "\\x{E0D1}0-9",
        "L" | "Lu" | "Ll" | "Lt" | "Lm" | "Lo" => "\\x{E0D2}A-Za-z",
        "P" => "\\x{E0D3}!-#%-*,-/:-;?-@\\[-\\]_\\{\\}",
        "M" => "\\x{E0D4}",
        "S" => "\\x{E0D5}\\$\\+<->\\^`\\|~",
        _ => return None,
    })
}

/// `true` when a pattern uses a Unicode class and so runs on collapsed text.
fn uses_classes(expr: &str) -> bool {
    ["N", "L", "P", "M", "S", "Lu", "Ll", "Lt", "Lm", "Lo"]
        .iter()
        .any(|c| expr.contains(&format!("\\p{{{c}}}")))
}

/// Rewrites an ECMAScript pattern of llama.cpp for `fancy-regex`: `\p{..}`
/// classes become their collapsed form, and `\d` is ASCII as in `std::regex`.
fn translate(expr: &str, collapsed: bool) -> Result<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = String::with_capacity(expr.len() + 16);
    let mut inside = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\\' && i + 1 < chars.len() {
            let n = chars[i + 1];
            if n == 'p' && collapsed && chars.get(i + 2) == Some(&'{') {
                let close = chars[i + 3..].iter().position(|&x| x == '}');
                if let Some(rel) = close {
                    let name: String = chars[i + 3..i + 3 + rel].iter().collect();
                    if let Some(class) = collapsed_class(&name) {
                        if inside {
                            out.push_str(class);
                        } else {
                            out.push('[');
                            out.push_str(class);
                            out.push(']');
                        }
                        i += 4 + rel;
                        continue;
                    }
                }
                return Err(ModelError::Metadata {
                    key: "tokenizer.ggml.pre".into(),
                    reason: format!("unsupported class in pre-tokenizer regex {expr:?}"),
                });
            }
            if n == 'd' {
                out.push_str(if inside { "0-9" } else { "[0-9]" });
                i += 2;
                continue;
            }
            out.push(c);
            out.push(n);
            i += 2;
            continue;
        }
        if c == '[' && !inside {
            inside = true;
        } else if c == ']' && inside {
            inside = false;
        }
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            _ => out.push(c),
        }
        i += 1;
    }
    Ok(out)
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value (`None`: key absent,
    /// which llama.cpp treats as "default" with a warning).
    ///
    /// # Errors
    /// [`ModelError::Metadata`] for a pre type combs does not implement.
    pub(crate) fn new(pre: Option<&str>) -> Result<PreTokenizer> {
        let name = pre.filter(|p| !p.is_empty()).unwrap_or("default");
        let spec = pre_spec(name).ok_or_else(|| ModelError::Metadata {
            key: "tokenizer.ggml.pre".into(),
            reason: format!("unsupported pre-tokenizer type `{name}`"),
        })?;
        let mut splitters = Vec::with_capacity(spec.regexes.len());
        let mut needs_collapse = false;
        for &expr in spec.regexes {
            let s = match expr {
                GPT2 => Splitter::Gpt2,
                LLAMA3 => Splitter::Llama3 {
                    digits: 3,
                    marks: false,
                },
                QWEN2 => Splitter::Llama3 {
                    digits: 1,
                    marks: false,
                },
                QWEN35 => Splitter::Llama3 {
                    digits: 1,
                    marks: true,
                },
                NEWLINES => Splitter::Newlines,
                _ => {
                    let collapsed = uses_classes(expr);
                    needs_collapse |= collapsed;
                    let pattern = translate(expr, collapsed)?;
                    let re =
                        fancy_regex::Regex::new(&pattern).map_err(|e| ModelError::Metadata {
                            key: "tokenizer.ggml.pre".into(),
                            reason: format!("pre-tokenizer regex {expr:?}: {e}"),
                        })?;
                    Splitter::Regex { re, collapsed }
                }
            };
            splitters.push(s);
        }
        Ok(PreTokenizer {
            splitters,
            needs_collapse,
            clean_spaces: spec.clean_spaces,
            ignore_merges: spec.ignore_merges,
            add_bos: spec.add_bos,
            no_bos: spec.no_bos,
        })
    }

    /// Splits text into words, each written in the GPT-2 byte alphabet.
    pub(crate) fn split(&self, text: &str) -> Vec<String> {
        let cpts: Vec<char> = text.chars().collect();
        let flags: Vec<CptFlags> = cpts.iter().map(|&c| unicode::flags(c)).collect();
        let mut offsets = vec![cpts.len()];
        let mut collapsed: Option<Haystack> = None;
        let mut wide: Option<Haystack> = None;
        for s in &self.splitters {
            offsets = match s {
                Splitter::Gpt2 => split_gpt2(&cpts, &flags, &offsets),
                Splitter::Llama3 { digits, marks } => {
                    split_llama3(&cpts, &flags, &offsets, *digits, *marks)
                }
                Splitter::Newlines => split_newlines(&cpts, &offsets),
                Splitter::Regex { re, collapsed: c } => {
                    let hay = if *c {
                        collapsed.get_or_insert_with(|| Haystack::collapsed(&cpts, &flags))
                    } else {
                        wide.get_or_insert_with(|| Haystack::wide(&cpts, &flags))
                    };
                    split_regex(re, hay, &offsets)
                }
            };
        }
        debug_assert!(self.needs_collapse || collapsed.is_none());

        let mut words = Vec::with_capacity(offsets.len());
        let mut start = 0;
        let mut buf = [0u8; 4];
        for len in offsets {
            let mut w = String::with_capacity(len * 2);
            for &c in &cpts[start..start + len] {
                for &b in c.encode_utf8(&mut buf).as_bytes() {
                    w.push(BYTE_TO_CHAR[b as usize]);
                }
            }
            words.push(w);
            start += len;
        }
        words
    }
}

/// The text a regex runs on, with a map from byte offsets to code point indices.
struct Haystack {
    text: String,
    /// `cpt_index[b]`: index of the code point starting at byte `b` (and at the end).
    cpt_index: Vec<u32>,
    /// `byte_pos[i]`: byte offset of code point `i`.
    byte_pos: Vec<usize>,
}

impl Haystack {
    fn build(chars: impl Iterator<Item = char>, n: usize) -> Haystack {
        let mut text = String::with_capacity(n);
        let mut byte_pos = Vec::with_capacity(n + 1);
        for c in chars {
            byte_pos.push(text.len());
            text.push(c);
        }
        byte_pos.push(text.len());
        let mut cpt_index = vec![0u32; text.len() + 1];
        for (i, &b) in byte_pos.iter().enumerate() {
            cpt_index[b] = i as u32;
        }
        Haystack {
            text,
            cpt_index,
            byte_pos,
        }
    }

    /// Every non-ASCII code point replaced by its class stand-in, whitespace by `\x0B`.
    fn collapsed(cpts: &[char], flags: &[CptFlags]) -> Haystack {
        let it = cpts.iter().zip(flags).map(|(&c, &f)| {
            if (c as u32) < 128 {
                c
            } else if f.is_whitespace() {
                '\x0B'
            } else {
                collapsed_char(f)
            }
        });
        Haystack::build(it, cpts.len())
    }

    /// The code points themselves, non-ASCII whitespace replaced by `\x0B`.
    fn wide(cpts: &[char], flags: &[CptFlags]) -> Haystack {
        let it = cpts.iter().zip(flags).map(|(&c, &f)| {
            if (c as u32) >= 128 && f.is_whitespace() {
                '\x0B'
            } else {
                c
            }
        });
        Haystack::build(it, cpts.len())
    }
}

/// One regex over every segment: matches and the text between them become segments.
fn split_regex(re: &fancy_regex::Regex, hay: &Haystack, offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0usize;
    for &len in offsets {
        let (b0, b1) = (hay.byte_pos[start], hay.byte_pos[start + len]);
        let seg = &hay.text[b0..b1];
        let mut prev = 0usize;
        for m in re.find_iter(seg) {
            // A regex that fails at run time (backtrack limit) ends the segment's matches.
            let Ok(m) = m else { break };
            let ms = hay.cpt_index[b0 + m.start()] as usize - start;
            let me = hay.cpt_index[b0 + m.end()] as usize - start;
            if ms > prev {
                out.push(ms - prev);
            }
            if me > ms {
                out.push(me - ms);
            }
            prev = me;
        }
        if prev < len {
            out.push(len - prev);
        }
        start += len;
    }
    out
}

/// Cursor over one segment, emitting word lengths as `_add_token` does.
struct Seg<'a> {
    cpts: &'a [char],
    flags: &'a [CptFlags],
    ini: usize,
    end: usize,
    prev_end: usize,
    out: &'a mut Vec<usize>,
}

impl Seg<'_> {
    fn cpt(&self, p: usize) -> Option<char> {
        (p >= self.ini && p < self.end).then(|| self.cpts[p])
    }
    fn fl(&self, p: usize) -> CptFlags {
        if p >= self.ini && p < self.end {
            self.flags[p]
        } else {
            CptFlags::NONE
        }
    }
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }
    /// Runs of whitespace from `pos`: (count, end of the last `\r`/`\n` or 0).
    fn whitespace_run(&self, pos: usize) -> (usize, usize) {
        let mut n = 0;
        let mut last_rn = 0;
        while self.fl(pos + n).is_whitespace() {
            if matches!(self.cpt(pos + n), Some('\r' | '\n')) {
                last_rn = pos + n + 1;
            }
            n += 1;
        }
        (n, last_rn)
    }
    /// The end of the contraction (`'s 't 'm 'd 're 've 'll`, its letters
    /// compared after `fold`) that starts at `pos`, if one does.
    fn contraction_end(&self, pos: usize, fold: impl Fn(char) -> char) -> Option<usize> {
        if self.cpts[pos] != '\'' || pos + 1 >= self.end {
            return None;
        }
        let n = fold(self.cpts[pos + 1]);
        if matches!(n, 's' | 't' | 'm' | 'd') {
            return Some(pos + 2);
        }
        if pos + 2 < self.end {
            let nn = fold(self.cpts[pos + 2]);
            if matches!((n, nn), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                return Some(pos + 3);
            }
        }
        None
    }
    /// Where the word at `pos` ends when it starts with `nws` whitespace code
    /// points: `\s+(?!\S)` (all but the last, when text follows), `\s+`, or
    /// else a lone code point.
    fn whitespace_end(&self, pos: usize, nws: usize) -> usize {
        if nws > 1 && self.cpt(pos + nws).is_some() {
            pos + nws - 1
        } else if nws > 0 {
            pos + nws
        } else {
            pos + 1
        }
    }
}

fn for_each_segment(
    cpts: &[char],
    flags: &[CptFlags],
    offsets: &[usize],
    mut scan: impl FnMut(&mut Seg<'_>),
) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let mut seg = Seg {
            cpts,
            flags,
            ini: start,
            end: start + len,
            prev_end: start,
            out: &mut out,
        };
        scan(&mut seg);
        start += len;
    }
    out
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
/// (`unicode_regex_split_custom_gpt2`).
fn split_gpt2(cpts: &[char], flags: &[CptFlags], offsets: &[usize]) -> Vec<usize> {
    for_each_segment(cpts, flags, offsets, |s| {
        let mut pos = s.ini;
        while pos < s.end {
            let c = cpts[pos];
            let f = flags[pos];
            if let Some(end) = s.contraction_end(pos, |c| c) {
                pos += s.add(end);
                continue;
            }
            // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: the first class the code
            // point after an optional space is in, as long as it lasts.
            let other = |f: CptFlags| {
                !(f.is_whitespace() || f.is_letter() || f.is_number() || f.is_empty())
            };
            let classes: [fn(CptFlags) -> bool; 3] =
                [CptFlags::is_letter, CptFlags::is_number, other];
            let mut f2 = if c == ' ' { s.fl(pos + 1) } else { f };
            if let Some(class) = classes.into_iter().find(|class| class(f2)) {
                pos += usize::from(c == ' ');
                while class(f2) {
                    pos += 1;
                    f2 = s.fl(pos);
                }
                s.add(pos);
                continue;
            }
            let (nws, _) = s.whitespace_run(pos);
            pos = s.whitespace_end(pos, nws);
            s.add(pos);
        }
    })
}

/// The Llama-3 pattern and its Qwen2 (`digits` = 1) and Qwen3.5 (`marks`)
/// variants (`unicode_regex_split_custom_llama3` / `_qwen2` / `_qwen35`).
fn split_llama3(
    cpts: &[char],
    flags: &[CptFlags],
    offsets: &[usize],
    digits: usize,
    marks: bool,
) -> Vec<usize> {
    let wordish = |f: CptFlags| f.is_letter() || (marks && f.is_mark());
    for_each_segment(cpts, flags, offsets, |s| {
        let mut pos = s.ini;
        while pos < s.end {
            let c = cpts[pos];
            let f = flags[pos];
            if let Some(end) = s.contraction_end(pos, unicode::to_lower_ascii) {
                pos += s.add(end);
                continue;
            }
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(c == '\r' || c == '\n' || f.is_number()) && (wordish(f) || wordish(s.fl(pos + 1)))
            {
                pos += 1;
                while wordish(s.fl(pos)) {
                    pos += 1;
                }
                s.add(pos);
                continue;
            }
            // \p{N}{1,3} or \p{N}
            if f.is_number() {
                let mut ini = pos;
                while s.fl(pos).is_number() {
                    pos += 1;
                    if pos - ini >= digits {
                        s.add(pos);
                        ini = pos;
                    }
                }
                s.add(pos);
                continue;
            }
            // <space>?[^\s\p{L}\p{N}]+[\r\n]*
            let other = |f: CptFlags| !(f.is_whitespace() || wordish(f) || f.is_number());
            let mut f2 = if c == ' ' { s.fl(pos + 1) } else { f };
            if other(f2) && !f.is_empty() {
                pos += usize::from(c == ' ');
                while other(f2) && !f2.is_empty() {
                    pos += 1;
                    f2 = s.fl(pos);
                }
                while matches!(s.cpt(pos), Some('\r' | '\n')) {
                    pos += 1;
                }
                s.add(pos);
                continue;
            }
            let (nws, last_rn) = s.whitespace_run(pos);
            // \s*[\r\n]+, else \s+(?!\S), \s+ or one code point
            pos = if last_rn > 0 {
                last_rn
            } else {
                s.whitespace_end(pos, nws)
            };
            s.add(pos);
        }
    })
}

/// `[^\n]+|[\n]+` (`unicode_regex_split_custom_newlines`).
fn split_newlines(cpts: &[char], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let end = start + len;
        let mut pos = start;
        while pos < end {
            let nl = cpts[pos] == '\n';
            let run = pos;
            while pos < end && (cpts[pos] == '\n') == nl {
                pos += 1;
            }
            out.push(pos - run);
        }
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let p = PreTokenizer::new(Some(pre)).expect("known pre type");
        // Undo the byte alphabet for readable assertions.
        p.split(text)
            .into_iter()
            .map(|w| {
                let bytes: Vec<u8> = w.chars().filter_map(unicode::char_to_byte).collect();
                String::from_utf8(bytes).expect("utf-8 word")
            })
            .collect()
    }

    #[test]
    fn gpt2_splits_words_spaces_and_contractions() {
        assert_eq!(
            words("gpt-2", "Hello world's  end  "),
            ["Hello", " world", "'s", " ", " end", "  "]
        );
    }

    #[test]
    fn smollm_isolates_digits() {
        assert_eq!(words("smollm", "abc 123"), ["abc", " ", "1", "2", "3"]);
    }

    #[test]
    fn llama3_groups_three_digits_and_newlines() {
        assert_eq!(
            words("llama-bpe", "I'M 1234567\n\n  x"),
            ["I", "'M", " ", "123", "456", "7", "\n\n", " ", " x"]
        );
    }

    #[test]
    fn every_listed_pre_type_compiles() {
        for pre in [
            "default",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "spark2_5",
            "youtu",
            "falcon",
            "jais-2",
            "poro-chat",
            "viking",
            "tekken",
            "chameleon",
            "gpt-4o",
            "granite-embed-multi-97m",
            "bailingmoe",
            "seed-coder",
            "ufakzeka",
            "laguna",
            "exaone-moe",
            "minicpm5",
        ] {
            let p = PreTokenizer::new(Some(pre)).unwrap_or_else(|e| panic!("{pre}: {e}"));
            let w = p.split("Hello, World! 1234 日本語 \u{3000} x\r\n");
            assert!(!w.is_empty(), "{pre}");
        }
    }

    #[test]
    fn unknown_pre_type_is_an_error() {
        assert!(PreTokenizer::new(Some("no-such-pre")).is_err());
    }
}
