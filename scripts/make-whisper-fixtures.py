#!/usr/bin/env python3
"""Reference fixtures for the Whisper tests, from faster-whisper 1.2.1 and
openai-whisper on this machine's CPU (run in the venv that
scripts/setup-whisper-refs.sh makes, after scripts/fetch-test-audio.sh):

  ~/.cache/combs/whisper-refs/venv/bin/python scripts/make-whisper-fixtures.py

Both references read the same 16 kHz arrays: faster-whisper's decode_audio
(PyAV: s16 mono at 16 kHz, then / 32768), whose raw int16 copies go to
~/.cache/combs/audio/ref16k/<clip>.s16 for the tests, and both run the
same weights (the CTranslate2 models, and openai-whisper checkpoints built
from them by scripts/whisper_refs/ct2_to_openai.py).

Writes tests/fixtures/whisper/:
  clips.json             per clip: source file, rate/channels, the 16 kHz
                         array's length and sha256 (little-endian f32 bytes),
                         the packaged reference text
  mel_filters_80.f32     openai-whisper's mel_filters.npz "mel_80" (80 x 201,
                         little-endian f32, row-major): what whisper.cpp
                         files carry
  features.json          per clip: faster-whisper FeatureExtractor (padding
                         160) shape, mean, max, min, and the frame step of
                         the subsample in features/<clip>.f32
  features/<clip>.f32    frames 0, 7, 14, ... of those features: for each
                         kept frame, its n_mels values (frame-major, f32 LE)
  transcripts.json       per model and clip: faster-whisper greedy and beam 5,
                         openai-whisper greedy (segments with start, end,
                         text, tokens, avg_logprob, no_speech_prob), whether
                         the two greedy references agree
  wer.json               tiny.en WER on sample.wav against sample.stm
  encoder_ref.json       openai-whisper on sample.wav's first window: encoder
                         output stats and a strided subsample, first-step
                         decoder logits (top 10 and a strided subsample)
"""
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

import faster_whisper
import whisper
from faster_whisper import WhisperModel
from faster_whisper.audio import decode_audio
from faster_whisper.feature_extractor import FeatureExtractor

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("COMBS_CACHE", Path.home() / ".cache" / "combs"))
AUDIO = CACHE / "audio"
REFS = CACHE / "whisper-refs"
OUT = REPO / "tests" / "fixtures" / "whisper"
FRAME_STEP = 7
THREADS = int(os.environ.get("THREADS", "2"))

CLIPS = [
    # name, file, where it comes from
    ("sample", "sample.wav", "pyannote-audio==4.0.7 pyannote/audio/sample/sample.wav"),
    ("counting", "counting.wav", "pytest-audioeval==0.1.3 samples/audio/en"),
    ("hello_world", "hello_world.wav", "pytest-audioeval==0.1.3 samples/audio/en"),
    ("quick_brown_fox", "quick_brown_fox.wav", "pytest-audioeval==0.1.3 samples/audio/en"),
    ("espeak_weather", "espeak_weather.wav", "espeak-ng, sox to 16 kHz"),
    ("espeak_numbers", "espeak_numbers.wav", "espeak-ng, sox to 16 kHz"),
    ("espeak_library", "espeak_library.wav", "espeak-ng, sox to 16 kHz"),
    ("espeak_engine", "espeak_engine.wav", "espeak-ng, sox to 16 kHz"),
    ("espeak_stereo44k", "espeak_stereo44k.wav", "espeak_weather, sox to 44.1 kHz stereo 24-bit"),
    ("espeak_8k", "espeak_8k.wav", "espeak_library, sox to 8 kHz"),
    ("espeak_flac", "espeak_flac.flac", "espeak_numbers, sox to FLAC"),
]
MODELS = ["tiny.en", "base"]


def sha256_f32(a):
    return hashlib.sha256(np.ascontiguousarray(a, dtype="<f4").tobytes()).hexdigest()


def reference_text(name):
    if name == "sample":
        lines = (AUDIO / "sample.stm").read_text().splitlines()
        return " ".join(l.split(None, 5)[5] for l in lines if len(l.split(None, 5)) == 6)
    return (AUDIO / f"{name}.txt").read_text().strip()


def normalize(text):
    text = text.lower().replace("-", " ")
    text = re.sub(r"[^\w\s']", " ", text)
    return " ".join(text.split())


def segments_fw(segs):
    return [
        dict(start=round(s.start, 3), end=round(s.end, 3), text=s.text, tokens=list(s.tokens),
             avg_logprob=round(s.avg_logprob, 5), no_speech_prob=round(s.no_speech_prob, 5))
        for s in segs
    ]


def segments_oa(result):
    return [
        dict(start=round(s["start"], 3), end=round(s["end"], 3), text=s["text"], tokens=list(s["tokens"]),
             avg_logprob=round(s["avg_logprob"], 5), no_speech_prob=round(s["no_speech_prob"], 5))
        for s in result["segments"]
    ]


def soundinfo(path):
    import av
    with av.open(str(path)) as c:
        s = c.streams.audio[0]
        return dict(sample_rate=s.rate, channels=s.channels, codec=s.codec_context.name)


def main():
    torch.set_num_threads(THREADS)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "features").mkdir(exist_ok=True)
    (AUDIO / "ref16k").mkdir(exist_ok=True)

    filters = np.load(Path(whisper.__file__).parent / "assets" / "mel_filters.npz")["mel_80"].astype("<f4")
    filters.tofile(OUT / "mel_filters_80.f32")
    fe = FeatureExtractor(feature_size=80)
    filter_diff = float(np.abs(fe.mel_filters - filters).max())

    clips, features, arrays = {}, {}, {}
    for name, file, source in CLIPS:
        path = AUDIO / file
        audio = decode_audio(str(path), sampling_rate=16000)
        arrays[name] = audio
        (np.round(audio * 32768.0).astype("<i2")).tofile(AUDIO / "ref16k" / f"{name}.s16")
        info = soundinfo(path)
        clips[name] = dict(file=file, source=source, **info, n_samples_16k=int(audio.shape[0]),
                           sha256_16k=sha256_f32(audio), reference_text=reference_text(name))
        feats = fe(audio)  # padding=160, as WhisperModel.transcribe calls it
        kept = feats[:, ::FRAME_STEP]
        np.ascontiguousarray(kept.T, dtype="<f4").tofile(OUT / "features" / f"{name}.f32")
        features[name] = dict(n_mels=int(feats.shape[0]), n_frames=int(feats.shape[1]), pad_samples=160,
                              frame_step=FRAME_STEP, n_kept=int(kept.shape[1]), mean=float(feats.mean()),
                              max=float(feats.max()), min=float(feats.min()))
    features = dict(
        note="faster-whisper 1.2.1 FeatureExtractor(feature_size=80)(audio) with its own filterbank; "
             f"max |its filters - mel_filters_80.f32| = {filter_diff:.3g}",
        clips=features,
    )
    (OUT / "clips.json").write_text(json.dumps(clips, indent=1) + "\n")
    (OUT / "features.json").write_text(json.dumps(features, indent=1) + "\n")

    transcripts = dict(
        faster_whisper=faster_whisper.__version__, openai_whisper=whisper.__version__,
        options=dict(common="language=en, temperature=0.0, condition_on_previous_text=False, "
                            "timestamps on, float32 on CPU",
                     faster_whisper="compute_type=float32, vad_filter=False, without_timestamps=False, "
                                    "beam_size=1 (greedy) and 5 (beam5)",
                     openai_whisper="beam_size=None, fp16=False"),
        models={},
    )
    timing = {}
    for model_name in MODELS:
        fw = WhisperModel(str(REFS / "ct2" / model_name), device="cpu", compute_type="float32",
                          cpu_threads=THREADS)
        oa = whisper.load_model(str(REFS / "openai" / f"{model_name}.pt"), device="cpu")
        per_clip = {}
        for name, _, _ in CLIPS:
            audio = arrays[name]
            out = {}
            t0 = time.time()
            for key, beam in (("fw_greedy", 1), ("fw_beam5", 5)):
                segs, _info = fw.transcribe(audio, language="en", beam_size=beam, temperature=0.0,
                                            condition_on_previous_text=False, vad_filter=False,
                                            without_timestamps=False)
                segs = segments_fw(list(segs))
                out[key] = dict(text="".join(s["text"] for s in segs).strip(), segments=segs)
            res = oa.transcribe(audio, language="en", temperature=0.0, condition_on_previous_text=False,
                                beam_size=None, fp16=False, verbose=None)
            segs = segments_oa(res)
            out["oa_greedy"] = dict(text="".join(s["text"] for s in segs).strip(), segments=segs)
            a, b = out["fw_greedy"], out["oa_greedy"]
            same_text = [s["text"] for s in a["segments"]] == [s["text"] for s in b["segments"]]
            dt = None
            if same_text:
                dt = max((max(abs(x["start"] - y["start"]), abs(x["end"] - y["end"]))
                          for x, y in zip(a["segments"], b["segments"])), default=0.0)
            out["references_agree"] = same_text
            out["max_timestamp_diff_s"] = dt
            per_clip[name] = out
            timing[f"{model_name}/{name}"] = round(time.time() - t0, 2)
            print(f"{model_name:8} {name:18} agree={same_text!s:5} fw: {a['text']!r} | oa: {b['text']!r}",
                  flush=True)
        transcripts["models"][model_name] = per_clip

        if model_name == MODELS[0]:
            import jiwer
            from whisper.normalizers import EnglishTextNormalizer
            english = EnglishTextNormalizer()
            ref_text = clips["sample"]["reference_text"]
            keys = ("fw_greedy", "fw_beam5", "oa_greedy")
            wer = {k: float(jiwer.wer(normalize(ref_text), normalize(per_clip["sample"][k]["text"])))
                   for k in keys}
            wer_english = {k: float(jiwer.wer(english(ref_text), english(per_clip["sample"][k]["text"])))
                           for k in keys}
            wer_raw = {k: float(jiwer.wer(ref_text, per_clip["sample"][k]["text"])) for k in keys}
            (OUT / "wer.json").write_text(json.dumps(dict(
                model=model_name, clip="sample", reference="sample.stm (all speakers, time order)",
                normalization="lowercase, punctuation except apostrophes to spaces, hyphens to spaces",
                wer=wer,
                wer_openai_english_normalizer=wer_english,
                wer_unnormalized=wer_raw), indent=1) + "\n")
            print("WER", wer, "EnglishTextNormalizer", wer_english, "raw", wer_raw)

        encoder_ref(oa, model_name, arrays["sample"])
    (OUT / "transcripts.json").write_text(json.dumps(transcripts, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(timing))


def encoder_ref(oa, model_name, audio):
    """Encoder output and first-step logits on sample.wav's first window."""
    path = OUT / "encoder_ref.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    mel = whisper.log_mel_spectrogram(torch.from_numpy(audio), oa.dims.n_mels, padding=whisper.audio.N_SAMPLES)
    window = whisper.audio.pad_or_trim(mel[:, : mel.shape[-1] - whisper.audio.N_FRAMES], whisper.audio.N_FRAMES)
    tok = whisper.tokenizer.get_tokenizer(oa.is_multilingual, num_languages=oa.num_languages, language="en",
                                          task="transcribe")
    tokens = list(tok.sot_sequence)
    with torch.no_grad():
        enc = oa.embed_audio(window[None].float())[0]
        logits = oa.logits(torch.tensor([tokens]), enc[None])[0, -1]
    e = enc.numpy().astype(np.float64)
    l = logits.numpy().astype(np.float64)
    top = np.argsort(-l)[:10]
    enc_step, logit_step = 211, 97
    data[model_name] = dict(
        clip="sample", window="frames 0..3000 of log_mel_spectrogram(audio, padding=N_SAMPLES)",
        mel_sha256=sha256_f32(window.numpy()),
        mel=dict(shape=list(window.shape), content_frames=int(mel.shape[-1] - whisper.audio.N_FRAMES),
                 mean=float(window.mean()), max=float(window.max()), subsample_step=101,
                 subsample=[round(float(x), 6) for x in window.numpy().reshape(-1)[::101]]),
        encoder=dict(shape=list(e.shape), mean=e.mean(), std=e.std(), abs_max=np.abs(e).max(),
                     subsample_step=enc_step, subsample=[round(float(x), 6) for x in e.reshape(-1)[::enc_step]]),
        tokens=tokens,
        logits=dict(n_vocab=int(l.shape[0]), mean=l.mean(), std=l.std(),
                    top10_ids=[int(i) for i in top], top10_values=[round(float(l[i]), 6) for i in top],
                    subsample_step=logit_step, subsample=[round(float(x), 5) for x in l[::logit_step]]),
    )
    path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
