//! The tokenizers of the models, read from GGUF metadata and matching
//! llama.cpp's `llama_tokenize` / `llama_token_to_piece` / `llama_detokenize`
//! (`src/llama-vocab.cpp`, `src/unicode.cpp`) token for token.
//!
//! Two vocabulary families: `tokenizer.ggml.model = "gpt2"` (byte-level BPE:
//! a pre-tokenizer regex list chosen by `tokenizer.ggml.pre`, then merges by
//! rank) and `"llama"` (SentencePiece-style: highest-score bigram merges over
//! the whole text, `▁` for spaces, `<0xXX>` byte fallback; Gemma uses this
//! with `add_space_prefix = false`). Special tokens are split out of the text
//! first. Chat templates are rendered by [`apply_chat_template`].
//!
//! Files: `vocab` (tokens, special ids, EOG set), `special` (special-token
//! splitting), `pretype` + `pretokenize` + `bpe` (gpt2), `spm` (llama),
//! `decode` (pieces and detokenizing), `stream` ([`StreamDecoder`]), `chat`
//! (templates), `unicode` (code-point classes, GPT-2 byte alphabet), `hash`.

mod bpe;
mod chat;
mod decode;
mod hash;
mod pretokenize;
mod pretype;
mod special;
mod spm;
mod stream;
mod symbols;
mod unicode;
mod vocab;
pub mod whisper;
pub mod whisper_bpe;

pub use chat::{
    CHAT_TEMPLATE_FUEL, CHATML_TEMPLATE, ChatMessage, IMAGE_MARKER, MAX_CHAT_OUTPUT,
    apply_chat_template,
};
pub use stream::StreamDecoder;

use crate::error::{ModelError, Result};
use crate::formats::gguf::{GgufFile, MetaArray};
use bpe::BpeRanks;
use decode::DecodeFlags;
use pretokenize::PreTokenizer;
use special::{Fragment, SpecialIndex};
use vocab::{SpecialIds, SpecialKeys, Vocab, VocabInput, VocabKind};

/// How raw text between special tokens becomes tokens.
#[derive(Debug)]
enum Algorithm {
    /// SentencePiece-style bigram merges by score.
    Spm,
    /// Pre-tokenizer, then byte-level BPE merges by rank.
    Bpe {
        ranks: BpeRanks,
        pre: Box<PreTokenizer>,
    },
}

/// A model's tokenizer: text to token ids and back, plus its chat template.
#[derive(Debug)]
pub struct Tokenizer {
    vocab: Vocab,
    special: SpecialIndex,
    algorithm: Algorithm,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    /// HF `Metaspace` prefixing instead of llama.cpp's (see [`METASPACE_KEY`]).
    metaspace: Option<MetaspacePrepend>,
    clean_spaces: bool,
    chat_template: Option<String>,
}

/// combs' own metadata key for an SPM vocabulary read from an HF
/// `tokenizer.json` whose `▁` prefix comes from a `Metaspace`
/// pre-tokenizer: `"always"` or `"first"`, its `prepend_scheme`. Metaspace
/// prepends `▁` only to text that does not already start with a space, and
/// with `"first"` only to text at the very start of the input; llama.cpp's
/// `add_space_prefix` prepends it to every text at the start or after a
/// special token. Absent from GGUF files, so their behaviour is llama.cpp's.
pub const METASPACE_KEY: &str = "combs.tokenizer.metaspace_prepend_scheme";

/// The `prepend_scheme` of an HF `Metaspace` pre-tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MetaspacePrepend {
    Always,
    First,
}

/// Everything the tokenizer reads from a GGUF file, as plain data.
pub(crate) struct TokenizerSpec {
    pub(crate) model: String,
    pub(crate) pre: Option<String>,
    pub(crate) tokens: Vec<Vec<u8>>,
    pub(crate) scores: Option<Vec<f32>>,
    pub(crate) token_types: Option<Vec<i32>>,
    pub(crate) merges: Option<Vec<String>>,
    pub(crate) keys: SpecialKeys,
    pub(crate) add_bos: Option<bool>,
    pub(crate) add_eos: Option<bool>,
    pub(crate) add_space_prefix: Option<bool>,
    pub(crate) metaspace: Option<String>,
    pub(crate) chat_template: Option<String>,
    pub(crate) general_name: Option<String>,
    pub(crate) general_arch: Option<String>,
}

fn missing(key: &str) -> ModelError {
    ModelError::Metadata {
        key: key.to_string(),
        reason: "missing".into(),
    }
}

/// A float array that llama.cpp also accepts as int32 (`tokenizer.ggml.scores`).
fn float_array(g: &GgufFile, key: &str) -> Result<Option<Vec<f32>>> {
    let Some(arr) = g.get_arr(key)? else {
        return Ok(None);
    };
    let v = match arr {
        MetaArray::F32(v) => v.clone(),
        MetaArray::F64(v) => v.iter().map(|&x| x as f32).collect(),
        MetaArray::I32(v) => v.iter().map(|&x| x as f32).collect(),
        other => {
            return Err(ModelError::Metadata {
                key: key.to_string(),
                reason: format!("expected an array of floats, found {}", other.type_desc()),
            });
        }
    };
    Ok(Some(v))
}

impl TokenizerSpec {
    /// Refuses a BOS, EOS or padding id that a key states outside the
    /// vocabulary: encoding would emit it and the model could not embed it.
    /// llama.cpp warns and falls back to the default there; combs refuses
    /// the file, since it cannot have been converted correctly. The other
    /// special ids keep llama.cpp's leniency (an id out of range is dropped).
    fn check_required_ids(&self) -> Result<()> {
        let n = self.tokens.len();
        let ids = self.keys.ids;
        for (key, id) in [
            ("tokenizer.ggml.bos_token_id", ids.bos),
            ("tokenizer.ggml.eos_token_id", ids.eos),
            ("tokenizer.ggml.padding_token_id", ids.pad),
        ] {
            if let Some(id) = id
                && id as usize >= n
            {
                return Err(ModelError::Metadata {
                    key: key.into(),
                    reason: format!("token id {id} is outside the vocabulary of {n} tokens"),
                });
            }
        }
        Ok(())
    }

    /// Reads the `tokenizer.*` keys (and `general.name` / `general.architecture`).
    fn from_gguf(g: &GgufFile) -> Result<TokenizerSpec> {
        let model = g
            .get_str("tokenizer.ggml.model")?
            .ok_or_else(|| missing("tokenizer.ggml.model"))?
            .to_string();
        let tokens = g
            .get_arr_bytes("tokenizer.ggml.tokens")?
            .ok_or_else(|| missing("tokenizer.ggml.tokens"))?
            .into_iter()
            .map(<[u8]>::to_vec)
            .collect();
        let id = |k: &str| g.get_u32(&format!("tokenizer.ggml.{k}"));
        let mut ids = SpecialIds::default();
        for (key, slot) in SpecialIds::KEYS {
            *slot(&mut ids) = id(key)?;
        }
        let keys = SpecialKeys {
            ids,
            prefix: id("prefix_token_id")?,
            suffix: id("suffix_token_id")?,
            middle: id("middle_token_id")?,
        };
        let merges = match g.get_arr("tokenizer.ggml.merges")? {
            None => None,
            Some(_) => Some(
                g.get_arr_str("tokenizer.ggml.merges")?
                    .map(<[String]>::to_vec)
                    .unwrap_or_default(),
            ),
        };
        Ok(TokenizerSpec {
            model,
            pre: g.get_str("tokenizer.ggml.pre")?.map(str::to_string),
            tokens,
            scores: float_array(g, "tokenizer.ggml.scores")?,
            token_types: g
                .get_arr_i32("tokenizer.ggml.token_type")?
                .map(|c| c.into_owned()),
            merges,
            keys,
            add_bos: g.get_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: g.get_bool("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: g.get_bool("tokenizer.ggml.add_space_prefix")?,
            metaspace: g.get_str(METASPACE_KEY)?.map(str::to_string),
            chat_template: g.get_str("tokenizer.chat_template")?.map(str::to_string),
            general_name: g.get_str("general.name").ok().flatten().map(str::to_string),
            general_arch: g
                .get_str("general.architecture")
                .ok()
                .flatten()
                .map(str::to_string),
        })
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's metadata.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when a tokenizer key is missing or malformed,
    /// or names a tokenizer model or pre-tokenizer combs does not implement.
    pub fn from_gguf(g: &GgufFile) -> Result<Tokenizer> {
        Self::from_spec(TokenizerSpec::from_gguf(g)?)
    }

    /// Builds the tokenizer of a GGUF file with `tokenizer.ggml.pre` and/or
    /// `tokenizer.ggml.add_space_prefix` replaced, so that tests can check
    /// metadata variants against llama.cpp on the vocabularies they have.
    ///
    /// # Errors
    /// As [`Tokenizer::from_gguf`].
    #[doc(hidden)]
    pub fn from_gguf_with_overrides(
        g: &GgufFile,
        pre: Option<&str>,
        add_space_prefix: Option<bool>,
    ) -> Result<Tokenizer> {
        let mut spec = TokenizerSpec::from_gguf(g)?;
        if let Some(pre) = pre {
            spec.pre = Some(pre.to_string());
        }
        if add_space_prefix.is_some() {
            spec.add_space_prefix = add_space_prefix;
        }
        Self::from_spec(spec)
    }

    /// Builds the tokenizer from plain metadata (the order of llama.cpp's loader).
    pub(crate) fn from_spec(spec: TokenizerSpec) -> Result<Tokenizer> {
        spec.check_required_ids()?;
        let kind = match spec.model.as_str() {
            "llama" => VocabKind::Spm,
            "gpt2" => VocabKind::Bpe,
            other => {
                return Err(ModelError::Metadata {
                    key: "tokenizer.ggml.model".into(),
                    reason: format!("unsupported tokenizer model `{other}`"),
                });
            }
        };
        let (mut add_bos, mut add_eos, mut add_space_prefix, clean_spaces);
        let mut defaults = SpecialIds::default();
        let pre = match kind {
            VocabKind::Spm => {
                defaults.bos = Some(1);
                defaults.eos = Some(2);
                defaults.unk = Some(0);
                (add_bos, add_eos, add_space_prefix, clean_spaces) = (true, false, true, false);
                None
            }
            VocabKind::Bpe => {
                let pre = PreTokenizer::new(spec.pre.as_deref())?;
                defaults.bos = (!pre.no_bos).then_some(11);
                defaults.eos = Some(11);
                (add_bos, add_eos, add_space_prefix) = (pre.add_bos, false, false);
                clean_spaces = pre.clean_spaces;
                Some(pre)
            }
        };
        if let Some(v) = spec.add_space_prefix {
            add_space_prefix = v;
        }
        if let Some(v) = spec.add_bos {
            add_bos = v;
        }
        if let Some(v) = spec.add_eos {
            add_eos = v;
        }
        let metaspace = match spec.metaspace.as_deref() {
            None => None,
            Some("always") => Some(MetaspacePrepend::Always),
            Some("first") => Some(MetaspacePrepend::First),
            Some(other) => {
                return Err(ModelError::Metadata {
                    key: METASPACE_KEY.into(),
                    reason: format!("unknown prepend scheme `{other}`"),
                });
            }
        };
        let vocab = Vocab::build(VocabInput {
            kind,
            tokens: spec.tokens,
            scores: spec.scores,
            token_types: spec.token_types,
            keys: spec.keys,
            defaults,
            general_name: spec.general_name.as_deref(),
            general_arch: spec.general_arch.as_deref(),
            pre: spec.pre.as_deref(),
        })?;
        let algorithm = match pre {
            None => Algorithm::Spm,
            Some(pre) => {
                let merges = spec
                    .merges
                    .ok_or_else(|| missing("tokenizer.ggml.merges"))?;
                Algorithm::Bpe {
                    ranks: BpeRanks::new(&merges, &vocab)?,
                    pre: Box::new(pre),
                }
            }
        };
        Ok(Tokenizer {
            special: SpecialIndex::new(&vocab),
            vocab,
            algorithm,
            add_bos,
            add_eos,
            add_space_prefix,
            metaspace,
            clean_spaces,
            chat_template: spec.chat_template,
        })
    }

    /// Tokenizes `text` as `llama_tokenize(text, add_special, parse_special)`:
    /// `add_special` adds BOS/EOS as the model's `add_bos_token` /
    /// `add_eos_token` say; `parse_special` lets control tokens written in the
    /// text (e.g. `<|im_start|>`) become those tokens instead of plain text.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when the model asks for a BOS/EOS token it
    /// does not have, or a byte has no token to fall back to.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let bytes = text.as_bytes();
        let frags = special::partition(&self.vocab, &self.special, bytes, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.push(self.required(self.vocab.ids.bos, "tokenizer.ggml.bos_token_id")?);
        }
        match &self.algorithm {
            Algorithm::Spm => {
                let mut prev_special = true;
                let mut buf = Vec::new();
                for frag in frags {
                    match frag {
                        Fragment::Text { start, len } => {
                            buf.clear();
                            let text = &bytes[start..start + len];
                            let prefix = match self.metaspace {
                                None => prev_special,
                                Some(scheme) => {
                                    text.first() != Some(&b' ')
                                        && (scheme == MetaspacePrepend::Always || start == 0)
                                }
                            };
                            if self.add_space_prefix && prefix {
                                buf.extend_from_slice("\u{2581}".as_bytes());
                            }
                            for &b in text {
                                if b == b' ' {
                                    buf.extend_from_slice("\u{2581}".as_bytes());
                                } else {
                                    buf.push(b);
                                }
                            }
                            spm::tokenize(&buf, &self.vocab, &mut out)?;
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Algorithm::Bpe { ranks, pre } => {
                let mut session = bpe::BpeSession::new(ranks, &self.vocab, pre.ignore_merges);
                for frag in frags {
                    match frag {
                        Fragment::Text { start, len } => {
                            // Fragments end at special tokens; should one cut a
                            // character, its bytes read as U+FFFD, as in llama.cpp.
                            let piece = unicode::str_lossy(&bytes[start..start + len]);
                            for word in pre.split(&piece) {
                                session.word(&word, &mut out);
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.push(self.required(self.vocab.ids.eos, "tokenizer.ggml.eos_token_id")?);
        }
        Ok(out)
    }

    fn required(&self, id: Option<u32>, key: &'static str) -> Result<u32> {
        id.ok_or_else(|| ModelError::Metadata {
            key: key.into(),
            reason: "the model asks for this token to be added but has none".into(),
        })
    }

    fn check(&self, t: u32) -> Result<()> {
        if (t as usize) < self.vocab.len() {
            Ok(())
        } else {
            Err(ModelError::TokenOutOfRange {
                token: i64::from(t),
                n_vocab: self.vocab.len(),
            })
        }
    }

    /// The bytes of one token as llama.cpp's `common_token_to_piece` gives
    /// them by default (`special = true`): control tokens such as
    /// `<|im_end|>` render as their text. A piece may be part of a UTF-8
    /// character; join pieces with [`StreamDecoder`].
    ///
    /// # Errors
    /// [`ModelError::TokenOutOfRange`] for an id outside the vocabulary.
    pub fn token_to_piece(&self, t: u32) -> Result<Vec<u8>> {
        self.token_to_piece_with(t, true)
    }

    /// As [`Tokenizer::token_to_piece`], choosing whether control and unknown
    /// tokens render (`special = true`) or come out empty.
    ///
    /// # Errors
    /// [`ModelError::TokenOutOfRange`] for an id outside the vocabulary.
    pub fn token_to_piece_with(&self, t: u32, special: bool) -> Result<Vec<u8>> {
        self.check(t)?;
        let mut out = Vec::new();
        decode::push_piece(&self.vocab, t, special, &mut out);
        Ok(out)
    }

    /// The text of a token sequence, as `common_detokenize(tokens, special =
    /// true)`: pieces joined byte-wise (so characters split across tokens come
    /// back whole), then made UTF-8 (invalid bytes become U+FFFD). Ids outside
    /// the vocabulary are skipped.
    pub fn decode(&self, tokens: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(tokens, true)).into_owned()
    }

    /// The raw bytes of a token sequence (`llama_detokenize` with
    /// `remove_special = false`, `unparse_special = special`).
    pub fn decode_bytes(&self, tokens: &[u32], special: bool) -> Vec<u8> {
        let flags = DecodeFlags {
            add_space_prefix: self.add_space_prefix,
            clean_spaces: self.clean_spaces,
        };
        decode::detokenize(&self.vocab, flags, tokens, special)
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    /// The BOS token, if the vocabulary has one.
    pub fn bos(&self) -> Option<u32> {
        self.vocab.ids.bos
    }

    /// The EOS token, if the vocabulary has one.
    pub fn eos(&self) -> Option<u32> {
        self.vocab.ids.eos
    }

    /// `true` for tokens that end generation: EOS, EOT, EOM and the tokens
    /// llama.cpp recognises by text (`<|im_end|>`, `<end_of_turn>`, …).
    pub fn is_eog(&self, t: u32) -> bool {
        self.vocab.is_eog(t)
    }

    /// All end-of-generation tokens, ascending.
    pub fn eog_tokens(&self) -> Vec<u32> {
        self.vocab.eog_ids()
    }

    /// `true` when [`Tokenizer::encode`] with `add_special` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// `true` when [`Tokenizer::encode`] with `add_special` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// The token's text as stored in the vocabulary (`llama_vocab_get_text`).
    pub fn token_text(&self, t: u32) -> Option<&[u8]> {
        self.vocab.tokens.get(t as usize).map(|d| d.text.as_slice())
    }

    /// The model's chat template (`tokenizer.chat_template`), if it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Renders a conversation with the model's template, or ChatML when it
    /// has none, as llama.cpp's common chat code does: `bos_token` and
    /// `eos_token` are the tokens' pieces, and a leading BOS (trailing EOS)
    /// text is removed when tokenizing with `add_special` will add it anyway.
    ///
    /// # Errors
    /// As [`apply_chat_template`].
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let text_of = |t: Option<u32>| {
            t.and_then(|t| self.token_to_piece(t).ok())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        let (bos, eos) = (text_of(self.bos()), text_of(self.eos()));
        let template = self.chat_template().unwrap_or(CHATML_TEMPLATE);
        let mut out = apply_chat_template(template, messages, add_generation_prompt, &bos, &eos)?;
        if self.add_bos && out.starts_with(&bos) {
            out.drain(..bos.len());
        }
        if self.add_eos && out.ends_with(&eos) {
            out.truncate(out.len() - eos.len());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(model: &str, tokens: &[&str]) -> TokenizerSpec {
        TokenizerSpec {
            model: model.to_string(),
            pre: None,
            tokens: tokens.iter().map(|t| t.as_bytes().to_vec()).collect(),
            scores: None,
            token_types: None,
            merges: None,
            keys: SpecialKeys::default(),
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
            metaspace: None,
            chat_template: None,
            general_name: None,
            general_arch: None,
        }
    }

    fn spm_spec() -> TokenizerSpec {
        let mut s = spec(
            "llama",
            &[
                "<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab", "▁ab", "<0x63>",
            ],
        );
        s.scores = Some(vec![0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -0.5, -1.5, -0.1, 0.0]);
        s.token_types = Some(vec![2, 3, 3, 1, 1, 1, 1, 1, 1, 6]);
        s
    }

    #[test]
    fn spm_merges_by_score_and_falls_back_to_bytes() {
        let t = Tokenizer::from_spec(spm_spec()).expect("valid vocabulary");
        // " ab" is the best-scoring piece; "c" only exists as a byte token.
        assert_eq!(t.encode("ab c", true, false).expect("encode"), [1, 8, 3, 9]);
        assert_eq!(t.decode(&[8, 3, 9]), "ab c");
    }

    #[test]
    fn spm_byte_without_token_is_an_error() {
        let t = Tokenizer::from_spec(spm_spec()).expect("valid vocabulary");
        assert!(matches!(
            t.encode("d", false, false),
            Err(ModelError::Metadata { .. })
        ));
    }

    #[test]
    fn unknown_tokenizer_model_is_rejected() {
        let err = Tokenizer::from_spec(spec("bert", &["a"])).expect_err("unsupported");
        assert!(
            matches!(err, ModelError::Metadata { ref key, .. } if key == "tokenizer.ggml.model")
        );
    }

    #[test]
    fn bpe_without_merges_is_rejected() {
        let err = Tokenizer::from_spec(spec("gpt2", &["a", "b"])).expect_err("no merges");
        assert!(
            matches!(err, ModelError::Metadata { ref key, .. } if key == "tokenizer.ggml.merges")
        );
    }

    #[test]
    fn duplicate_token_text_is_rejected() {
        let err = Tokenizer::from_spec(spec("llama", &["a", "b", "a"])).expect_err("duplicate");
        assert!(matches!(err, ModelError::Metadata { .. }));
    }

    #[test]
    fn short_score_array_is_rejected() {
        let mut s = spec("llama", &["a", "b", "c"]);
        s.scores = Some(vec![0.0]);
        assert!(Tokenizer::from_spec(s).is_err());
    }

    #[test]
    fn add_bos_without_bos_token_is_an_error_not_a_panic() {
        // The default SPM BOS id (1) is out of range for a one-token vocabulary.
        let t = Tokenizer::from_spec(spec("llama", &["▁a"])).expect("valid vocabulary");
        assert_eq!(t.bos(), None);
        assert!(t.encode("a", true, false).is_err());
        assert_eq!(t.encode("a", false, false).expect("no BOS asked"), [0]);
    }

    #[test]
    fn bpe_merges_and_byte_alphabet() {
        let mut s = spec("gpt2", &["a", "b", "Ġ", "ab", "Ġab", "<|end|>"]);
        s.pre = Some("gpt-2".into());
        s.merges = Some(vec!["a b".into(), "Ġ ab".into()]);
        s.token_types = Some(vec![1, 1, 1, 1, 1, 3]);
        let t = Tokenizer::from_spec(s).expect("valid vocabulary");
        assert_eq!(
            t.encode("ab ab<|end|>", false, true).expect("encode"),
            [3, 4, 5]
        );
        assert_eq!(t.decode(&[3, 4, 5]), "ab ab<|end|>");
        assert!(t.is_eog(5));
        assert_eq!(t.token_to_piece_with(5, false).expect("in range"), b"");
    }
}
