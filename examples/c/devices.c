/* devices.c: one model over several devices. The same greedy generation
 * runs on a runtime of one device (the reference), on a runtime of several
 * with the model split by layers (COMBS_SPLIT_LAYER, even shares): the
 * logits of every step must be the same bit for bit; then on a runtime of
 * several with one replica per device (COMBS_SPLIT_REPLICA): four paged
 * sessions, spread round-robin, advanced together by combs_batch_decode
 * (each device's sessions at once) must pick the tokens the sessions pick
 * alone on one device.
 *
 *   devices MODEL.gguf [N_TOKENS] [DEVICE,DEVICE,...]
 *
 * Devices default to "0,0": the first device opened twice, which stands for
 * two GPUs on a machine with one (or none: lavapipe). */
#include <combs.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_TOKENS = 64, MAX_DEVICES = 8, N_SESSIONS = 4 };

static const char *const PROMPTS[N_SESSIONS] = {"The capital of France is", "def fibonacci(n):",
                                                "Once upon a time", "1, 2, 3, 4,"};

#define CHECK(call)                                                                                     \
    do {                                                                                                \
        combs_status s_ = (call);                                                                       \
        if (s_ != COMBS_OK) {                                                                           \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, combs_status_str(s_), \
                    combs_last_error());                                                                \
            exit(1);                                                                                    \
        }                                                                                               \
    } while (0)

static combs_token argmax(const float *l, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return (combs_token)best;
}

static combs_session *start(combs_model *m, const char *prompt, combs_kv_kind kv) {
    combs_token toks[64];
    size_t n = 0;
    CHECK(combs_tokenize(m, prompt, strlen(prompt), true, toks, 64, &n));
    combs_session_options so = combs_session_default_options();
    so.n_ctx = 128;
    so.kv_kind = kv;
    so.page_size = 16;
    combs_session *s = NULL;
    CHECK(combs_session_create(m, &so, &s));
    CHECK(combs_session_prefill(s, toks, n));
    return s;
}

/* Greedy generation of `n` tokens; every step's logits into `logits`. */
static void generate(combs_model *m, const char *prompt, int n, float *logits, combs_token *out) {
    const size_t n_vocab = (size_t)combs_model_n_vocab(m);
    combs_session *s = start(m, prompt, COMBS_KV_CONTIGUOUS);
    for (int k = 0; k < n; k++) {
        const float *l = combs_session_logits(s);
        memcpy(logits + (size_t)k * n_vocab, l, n_vocab * sizeof(float));
        out[k] = argmax(l, n_vocab);
        CHECK(combs_session_decode(s, out[k]));
    }
    combs_session_free(s);
}

static combs_model *load(const char *path, const int32_t *devices, size_t n_devices,
                         combs_split_mode mode, const float *split) {
    combs_runtime_options ro = combs_runtime_default_options();
    ro.device_indices = devices;
    ro.n_devices = n_devices;
    ro.split_mode = mode;
    ro.tensor_split = split;
    combs_runtime *rt = NULL;
    combs_model *m = NULL;
    CHECK(combs_runtime_create(&ro, &rt));
    CHECK(combs_model_load(rt, path, NULL, &m));
    combs_runtime_free(rt); /* the model keeps its devices alive */
    return m;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [N_TOKENS] [DEVICE,DEVICE,...]\n", argv[0]);
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 8;
    if (n < 1 || n > MAX_TOKENS) n = 8;
    int32_t devices[MAX_DEVICES] = {0, 0};
    size_t n_devices = 2;
    if (argc > 3) {
        n_devices = 0;
        for (char *p = argv[3]; *p && n_devices < MAX_DEVICES;) {
            devices[n_devices++] = (int32_t)strtol(p, &p, 10);
            if (*p == ',') p++;
        }
    }
    if (n_devices < 2) {
        fprintf(stderr, "name at least two devices\n");
        return 2;
    }
    float shares[MAX_DEVICES];
    for (size_t i = 0; i < n_devices; i++) shares[i] = 1.0f;

    combs_model *one = load(argv[1], devices, 1, COMBS_SPLIT_LAYER, NULL);
    const size_t n_vocab = (size_t)combs_model_n_vocab(one);
    float *want = malloc(sizeof(float) * n_vocab * (size_t)n);
    float *got = malloc(sizeof(float) * n_vocab * (size_t)n);
    combs_token want_t[MAX_TOKENS], got_t[MAX_TOKENS];
    if (!want || !got) return 1;
    int failed = 0;

    /* Layer split: the same logits, bit for bit. */
    combs_model *split = load(argv[1], devices, n_devices, COMBS_SPLIT_LAYER, shares);
    generate(one, PROMPTS[0], n, want, want_t);
    generate(split, PROMPTS[0], n, got, got_t);
    int same = memcmp(want, got, sizeof(float) * n_vocab * (size_t)n) == 0;
    printf("%s layer split over %zu devices: %d steps, logits %s\n", same ? "ok  " : "FAIL", n_devices, n,
           same ? "bit-identical to one device" : "differ from one device");
    failed += !same;
    combs_model_free(split);

    /* Replicas: sessions spread over the devices, batched per device. */
    combs_model *rep = load(argv[1], devices, n_devices, COMBS_SPLIT_REPLICA, NULL);
    combs_session *ss[N_SESSIONS], *lone[N_SESSIONS];
    for (int i = 0; i < N_SESSIONS; i++) {
        ss[i] = start(rep, PROMPTS[i], COMBS_KV_PAGED);
        lone[i] = start(one, PROMPTS[i], COMBS_KV_CONTIGUOUS);
    }
    int agree = 1;
    for (int k = 0; k < n && agree; k++) {
        combs_token ts[N_SESSIONS];
        for (int i = 0; i < N_SESSIONS; i++) {
            ts[i] = argmax(combs_session_logits(lone[i]), n_vocab);
            agree &= argmax(combs_session_logits(ss[i]), n_vocab) == ts[i];
        }
        CHECK(combs_batch_decode(rep, ss, ts, N_SESSIONS));
        for (int i = 0; i < N_SESSIONS; i++) CHECK(combs_session_decode(lone[i], ts[i]));
    }
    printf("%s replicas on %zu devices: %d sessions, %d batched steps, tokens %s\n", agree ? "ok  " : "FAIL",
           n_devices, N_SESSIONS, n, agree ? "as alone on one device" : "differ from one device");
    failed += !agree;
    for (int i = 0; i < N_SESSIONS; i++) {
        combs_session_free(ss[i]);
        combs_session_free(lone[i]);
    }
    combs_model_free(rep);
    combs_model_free(one);
    free(want);
    free(got);
    if (failed) return 1;
    printf("all runs agree\n");
    return 0;
}
