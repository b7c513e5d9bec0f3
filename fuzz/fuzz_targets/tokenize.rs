//! Tokenizers of real vocabularies on arbitrary text: SmolLM2's byte-level
//! BPE and Gemma 3's SentencePiece. Encoding never fails on valid UTF-8,
//! decoding gives the text back (where it must: no specials parsed, and no
//! literal U+2581, which SentencePiece writes for a space), and any ids —
//! in the vocabulary or not — decode without panicking.
//!
//! SmolLM2's vocabulary lacks the byte-level symbols of a few control bytes
//! (0x06 among them), and llama.cpp drops those bytes when encoding; so for
//! BPE the text that comes back is the input less some bytes, not always
//! all of it. Gemma's byte fallback covers every byte.
#![no_main]

#[path = "common.rs"]
mod common;

use std::sync::OnceLock;

use combs::tokenizer::{StreamDecoder, Tokenizer};

fn vocab(spm: bool) -> &'static Tokenizer {
    static BPE: OnceLock<Tokenizer> = OnceLock::new();
    static SPM: OnceLock<Tokenizer> = OnceLock::new();
    if spm {
        SPM.get_or_init(|| common::tokenizer("gemma-3-270m-q4_k_m.gguf"))
    } else {
        BPE.get_or_init(|| common::tokenizer("SmolLM2-135M-Instruct.Q4_0.gguf"))
    }
}

/// Whether `a` is `b` with some bytes left out.
fn is_subsequence(a: &[u8], b: &[u8]) -> bool {
    let mut rest = b.iter();
    a.iter().all(|x| rest.any(|y| y == x))
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let spm = flags & 1 != 0;
    let tok = vocab(spm);
    let add_special = flags & 2 != 0;
    let parse_special = flags & 4 != 0;
    let text = String::from_utf8_lossy(rest);
    let ids = tok
        .encode(&text, add_special, parse_special)
        .expect("encoding valid UTF-8 never fails");
    let n = tok.n_vocab() as u32;
    assert!(ids.iter().all(|&t| t < n), "ids inside the vocabulary");
    if !add_special && !parse_special && !text.contains('\u{2581}') {
        let bytes = tok.decode_bytes(&ids, false);
        if spm {
            assert_eq!(tok.decode(&ids), text, "round trip");
        } else {
            assert!(
                is_subsequence(&bytes, text.as_bytes()),
                "{bytes:?} from {text:?}"
            );
        }
        // Dropped bytes can leave a character cut: only whole text streams.
        if let Ok(back) = std::str::from_utf8(&bytes) {
            // Streaming piece by piece gives the same text as decoding at once.
            let mut stream = StreamDecoder::new();
            let mut streamed = String::new();
            for &t in &ids {
                let piece = tok
                    .token_to_piece(t)
                    .expect("a piece for an id in the vocabulary");
                streamed.push_str(&stream.push(&piece));
            }
            streamed.push_str(&stream.flush());
            assert_eq!(streamed, back, "streamed decode");
        }
    }
    // Arbitrary ids: pieces or errors, never a panic.
    let raw: Vec<u32> = rest
        .chunks(3)
        .map(|c| c.iter().fold(0u32, |a, &b| (a << 8) | u32::from(b)))
        .collect();
    let _ = tok.decode_bytes(&raw, flags & 8 != 0);
    for &t in raw.iter().take(16) {
        let _ = tok.token_to_piece_with(t, flags & 16 != 0);
    }
});
