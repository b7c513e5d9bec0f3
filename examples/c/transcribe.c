/* transcribe.c: speech to text with the combs C API — load a whisper.cpp
 * model, read a WAV file (16-bit PCM or 32-bit float, any rate and channel
 * count, mixed down here) and print each segment as combs_transcribe()
 * delivers it:
 *
 *   transcribe MODEL.bin AUDIO.wav [LANGUAGE] [BEAM]
 *   [00:00.000 --> 00:04.320]  And so my fellow Americans ...
 *
 * Then checks that bad input is refused with a clear error (empty audio,
 * NaN samples, 0 Hz, an out-of-range beam size) and prints a summary line
 * "N segments, bad input refused" that ctest looks for. */
#include <combs.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, combs_status s) {
    fprintf(stderr, "transcribe: %s failed: %s: %s\n", what, combs_status_str(s), combs_last_error());
    return 1;
}

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* A minimal RIFF/WAVE reader: the "fmt " and "data" chunks of a PCM16 or
 * float32 file, every channel averaged into one. Returns a malloc'ed array
 * of *n samples at *rate Hz, or NULL with a message on stderr. */
static float *read_wav(const char *path, size_t *n, uint32_t *rate) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return NULL; }
    unsigned char hdr[12];
    float *out = NULL;
    unsigned char *data = NULL;
    uint16_t format = 0, channels = 0, bits = 0;
    uint32_t data_len = 0;
    if (fread(hdr, 1, 12, f) != 12 || memcmp(hdr, "RIFF", 4) || memcmp(hdr + 8, "WAVE", 4)) {
        fprintf(stderr, "%s: not a RIFF/WAVE file\n", path);
        goto done;
    }
    for (;;) {
        unsigned char ch[8];
        if (fread(ch, 1, 8, f) != 8) { fprintf(stderr, "%s: no data chunk\n", path); goto done; }
        uint32_t len = le32(ch + 4);
        if (!memcmp(ch, "fmt ", 4)) {
            unsigned char fmt[40];
            if (len < 16 || len > sizeof fmt || fread(fmt, 1, len, f) != len) { fprintf(stderr, "%s: bad fmt chunk\n", path); goto done; }
            format = le16(fmt);
            channels = le16(fmt + 2);
            *rate = le32(fmt + 4);
            bits = le16(fmt + 14);
            if (format == 0xFFFE && len >= 26) format = le16(fmt + 24); /* WAVE_FORMAT_EXTENSIBLE */
        } else if (!memcmp(ch, "data", 4)) {
            data_len = len;
            break;
        } else if (fseek(f, (long)len, SEEK_CUR)) {
            fprintf(stderr, "%s: truncated\n", path);
            goto done;
        }
        if (len & 1) fseek(f, 1, SEEK_CUR);
    }
    if (!channels || !((format == 1 && bits == 16) || (format == 3 && bits == 32))) {
        fprintf(stderr, "%s: only 16-bit PCM or 32-bit float WAV (format %u, %u bits, %u channels)\n", path, format,
                bits, channels);
        goto done;
    }
    data = malloc(data_len ? data_len : 1);
    if (!data) goto done;
    data_len = (uint32_t)fread(data, 1, data_len, f); /* a short read: what the file has */
    size_t frame = (size_t)channels * bits / 8;
    *n = data_len / frame;
    out = malloc((*n ? *n : 1) * sizeof *out);
    if (!out) goto done;
    for (size_t i = 0; i < *n; i++) {
        float sum = 0.0f;
        for (size_t c = 0; c < channels; c++) {
            const unsigned char *p = data + i * frame + c * bits / 8;
            if (format == 1) {
                sum += (float)(int16_t)le16(p) / 32768.0f;
            } else {
                uint32_t u = le32(p);
                float v;
                memcpy(&v, &u, sizeof v);
                sum += v;
            }
        }
        out[i] = sum / (float)channels;
    }
done:
    free(data);
    fclose(f);
    return out;
}

static void stamp(double t, char *buf, size_t cap) {
    long ms = lround(t * 1000.0);
    snprintf(buf, cap, "%02ld:%02ld.%03ld", ms / 60000, ms / 1000 % 60, ms % 1000);
}

/* Prints one segment; returns 0 to go on. */
static int32_t on_segment(const combs_segment *seg, void *user_data) {
    int *count = user_data;
    char a[32], b[32];
    stamp(seg->t0, a, sizeof a);
    stamp(seg->t1, b, sizeof b);
    printf("[%s --> %s] %s\n", a, b, seg->text);
    fflush(stdout);
    ++*count;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.bin AUDIO.wav [LANGUAGE] [BEAM]\n", argv[0]);
        return 2;
    }
    int rc = 1;
    combs_runtime *rt = NULL;
    combs_speech_model *model = NULL;
    size_t n = 0;
    uint32_t rate = 0;
    float *pcm = read_wav(argv[2], &n, &rate);
    if (!pcm) return 1;
    combs_status s;

    if ((s = combs_runtime_create(NULL, &rt)) != COMBS_OK) { rc = fail("combs_runtime_create", s); goto done; }
    if ((s = combs_speech_model_load(rt, argv[1], NULL, &model)) != COMBS_OK) {
        rc = fail("combs_speech_model_load", s);
        goto done;
    }

    combs_transcribe_options opts = combs_transcribe_default_options();
    if (argc > 3) opts.language = argv[3];
    if (argc > 4) opts.beam_size = atoi(argv[4]);
    int count = 0;
    if ((s = combs_transcribe(model, pcm, n, rate, &opts, on_segment, &count)) != COMBS_OK) {
        rc = fail("combs_transcribe", s);
        goto done;
    }

    /* Bad input: each refused with COMBS_ERR_INVALID_ARGUMENT and a message. */
    float nan_pcm[4] = {0.0f, NAN, 0.0f, 0.0f};
    combs_transcribe_options bad = combs_transcribe_default_options();
    bad.beam_size = 0;
    struct {
        const char *what;
        combs_status got;
    } checks[] = {
        {"empty audio", combs_transcribe(model, pcm, 0, rate, NULL, NULL, NULL)},
        {"NaN sample", combs_transcribe(model, nan_pcm, 4, 16000, NULL, NULL, NULL)},
        {"0 Hz", combs_transcribe(model, pcm, n, 0, NULL, NULL, NULL)},
        {"beam 0", combs_transcribe(model, pcm, n, rate, &bad, NULL, NULL)},
        {"NULL model", combs_transcribe(NULL, pcm, n, rate, NULL, NULL, NULL)},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        if (checks[i].got != COMBS_ERR_INVALID_ARGUMENT) {
            fprintf(stderr, "transcribe: %s gave %s\n", checks[i].what, combs_status_str(checks[i].got));
            goto done;
        }
    }
    printf("%d segments, bad input refused\n", count);
    rc = count > 0 ? 0 : 1;
done:
    combs_speech_model_free(model);
    combs_runtime_free(rt);
    free(pcm);
    return rc;
}
