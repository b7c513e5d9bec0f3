//! A scripted [`SpeechToTextModel`] for the decoding tests: its logits come
//! from a function of the window (the value of the first mel bin at the
//! window's first frame, which the tests set to the frame index) and the
//! sequence's tokens so far, so each test states the behaviour it expects.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{ModelError, Result};
use crate::models::speech::{
    AudioStates, LogMel, N_FRAMES, SpeechDecoder, SpeechToTextModel, WhisperHparams,
};
use crate::tokenizer::whisper::WhisperVocab;

/// Logits of one position: `(window key, tokens so far) -> n_vocab values`.
pub type Script = dyn Fn(f32, &[u32]) -> Vec<f32> + Send + Sync;

/// The scripted model.
pub struct MockModel {
    hp: WhisperHparams,
    vocab: WhisperVocab,
    filters: Vec<f32>,
    script: Box<Script>,
    /// Decoders created so far (one per decode attempt).
    pub decoders: AtomicUsize,
    /// Windows encoded, by key.
    pub encoded: Mutex<Vec<f32>>,
    /// The first tokens each decoder was stepped with.
    pub first_inputs: Mutex<Vec<Vec<u32>>>,
}

/// Pieces of a test vocabulary: the 256 bytes, then these words, then filler.
pub const WORDS: [&str; 8] = [
    " hello", " world", " the", " -", " '", " (", " again", " bye",
];

/// The id of word `i` of [`WORDS`].
pub fn word(i: usize) -> u32 {
    256 + i as u32
}

/// Logits favouring `picks` (`(token, logit)`), every other token at −10.
pub fn favour(n_vocab: usize, picks: &[(u32, f32)]) -> Vec<f32> {
    let mut l = vec![-10.0f32; n_vocab];
    for &(t, v) in picks {
        l[t as usize] = v;
    }
    l
}

impl MockModel {
    /// A tiny.en-shaped (`n_vocab` 51864) or multilingual (51865) model.
    pub fn new(n_vocab: usize, script: Box<Script>) -> Self {
        let mut pieces: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        pieces.extend(WORDS.iter().map(|w| w.as_bytes().to_vec()));
        let eot = if n_vocab > 51864 { 50257 } else { 50256 };
        while pieces.len() < eot {
            pieces.push(format!("\u{1}{}", pieces.len()).into_bytes());
        }
        let vocab = WhisperVocab::new(pieces, n_vocab).expect("test vocabulary");
        MockModel {
            hp: WhisperHparams {
                n_vocab,
                n_audio_ctx: 1500,
                n_audio_state: 8,
                n_audio_head: 1,
                n_audio_layer: 1,
                n_text_ctx: 448,
                n_text_state: 8,
                n_text_head: 1,
                n_text_layer: 1,
                n_mels: 4,
            },
            vocab,
            filters: vec![0.0; 4 * 201],
            script,
            decoders: AtomicUsize::new(0),
            encoded: Mutex::new(Vec::new()),
            first_inputs: Mutex::new(Vec::new()),
        }
    }

    /// Features of `content` frames plus 30 s of padding whose first mel bin
    /// holds the frame index (the window key).
    pub fn mel(content: usize) -> LogMel {
        let n_frames = content + N_FRAMES;
        let mut data = vec![0.0f32; 4 * n_frames];
        for (f, v) in data[..n_frames].iter_mut().enumerate() {
            *v = f as f32;
        }
        LogMel {
            n_mels: 4,
            n_frames,
            data,
        }
    }
}

struct MockAudio(f32);

struct MockDecoder<'m> {
    model: &'m MockModel,
    key: f32,
    seqs: Vec<Vec<u32>>,
    first: bool,
}

impl SpeechDecoder for MockDecoder<'_> {
    fn n_seqs(&self) -> usize {
        self.seqs.len()
    }

    fn n_past(&self) -> usize {
        self.seqs.first().map_or(0, Vec::len)
    }

    fn step(&mut self, tokens: &[&[u32]]) -> Result<Vec<f32>> {
        if tokens.len() != self.seqs.len() || tokens.iter().any(|t| t.is_empty()) {
            return Err(ModelError::invalid("tokens", "ragged"));
        }
        if self.n_past() + tokens[0].len() > self.model.hp.n_text_ctx {
            return Err(ModelError::ContextFull {
                n_ctx: self.model.hp.n_text_ctx,
                requested: self.n_past() + tokens[0].len(),
            });
        }
        if self.first {
            self.first = false;
            if let Ok(mut f) = self.model.first_inputs.lock() {
                f.push(tokens[0].to_vec());
            }
        }
        let mut out = Vec::new();
        for (s, t) in self.seqs.iter_mut().zip(tokens) {
            s.extend_from_slice(t);
            out.extend((self.model.script)(self.key, s));
        }
        Ok(out)
    }

    fn reorder(&mut self, source: &[usize]) -> Result<()> {
        let mut next = Vec::new();
        for &i in source {
            next.push(
                self.seqs
                    .get(i)
                    .cloned()
                    .ok_or_else(|| ModelError::invalid("source", "out of range"))?,
            );
        }
        self.seqs = next;
        Ok(())
    }

    fn reset(&mut self) {
        for s in &mut self.seqs {
            s.clear();
        }
    }
}

impl SpeechToTextModel for MockModel {
    fn hparams(&self) -> &WhisperHparams {
        &self.hp
    }

    fn mel_filters(&self) -> &[f32] {
        &self.filters
    }

    fn vocab(&self) -> &WhisperVocab {
        &self.vocab
    }

    fn encode(&self, mel: &LogMel) -> Result<AudioStates> {
        if mel.n_frames != N_FRAMES || mel.n_mels != 4 {
            return Err(ModelError::invalid("mel", "not one window"));
        }
        let key = mel.data[0];
        if let Ok(mut e) = self.encoded.lock() {
            e.push(key);
        }
        Ok(AudioStates {
            inner: Box::new(MockAudio(key)),
        })
    }

    fn decoder(&self, audio: &AudioStates, n_seqs: usize) -> Result<Box<dyn SpeechDecoder + '_>> {
        let key = audio
            .inner
            .downcast_ref::<MockAudio>()
            .ok_or_else(|| ModelError::invalid("audio", "from another model"))?
            .0;
        self.decoders.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(MockDecoder {
            model: self,
            key,
            seqs: vec![Vec::new(); n_seqs],
            first: true,
        }))
    }

    fn device_bytes(&self) -> u64 {
        0
    }
}
