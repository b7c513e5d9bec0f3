/* sessions.c: several sessions on one model are independent. Greedy
 * generation of two prompts, each alone, then interleaved step by step on
 * two sessions, then on two threads at once (one session each), then on two
 * paged sessions advanced together by combs_batch_decode (one forward pass
 * per step for both), then with the next tokens drawn on the device
 * (combs_session_decode_sample alone, combs_batch_decode_sample together;
 * their logits are not read back, so combs_session_logits must fail): every
 * run must give the same tokens. The model handle is freed before the
 * sessions (they keep it alive).
 *
 *   sessions MODEL.gguf [N_TOKENS] */
#define _POSIX_C_SOURCE 200809L
#include <combs.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_TOKENS = 64 };

static const char *const PROMPTS[2] = {"The capital of France is", "def fibonacci(n):"};

struct run {
    combs_model *model;
    combs_session *session;
    combs_sampler *sampler;
    const char *prompt;
    combs_kv_kind kv;
    int n;
    combs_token out[MAX_TOKENS];
    int n_out;
    combs_status status;
};

static combs_status start(struct run *r) {
    combs_token toks[64];
    size_t n = 0;
    combs_status s = combs_tokenize(r->model, r->prompt, strlen(r->prompt), true, toks, 64, &n);
    if (s != COMBS_OK) return s;
    combs_session_options so = combs_session_default_options();
    so.n_ctx = 128;
    so.kv_kind = r->kv;
    so.page_size = 16;
    if ((s = combs_session_create(r->model, &so, &r->session)) != COMBS_OK) return s;
    combs_sampler_options po = combs_sampler_default_options();
    po.temperature = 0;
    if ((s = combs_sampler_create(&po, &r->sampler)) != COMBS_OK) return s;
    r->n_out = 0;
    return combs_session_prefill(r->session, toks, n);
}

/* One greedy step: sample from the logits, record, decode. */
static combs_status step(struct run *r, size_t n_vocab) {
    combs_token t = combs_sampler_sample(r->sampler, combs_session_logits(r->session), n_vocab);
    if (t < 0) return COMBS_ERR_INVALID_ARGUMENT;
    r->out[r->n_out++] = t;
    return combs_session_decode(r->session, t);
}

static void finish(struct run *r) {
    combs_sampler_free(r->sampler);
    combs_session_free(r->session);
    r->sampler = NULL;
    r->session = NULL;
}

static bool collect(combs_token t, const char *piece, size_t len, void *user) {
    (void)piece;
    (void)len;
    struct run *r = user;
    r->out[r->n_out++] = t;
    return r->n_out < MAX_TOKENS;
}

static void *threaded(void *arg) {
    struct run *r = arg;
    r->status = start(r);
    if (r->status == COMBS_OK) r->status = combs_generate(r->session, r->sampler, (size_t)r->n, collect, r);
    if (r->status != COMBS_OK) fprintf(stderr, "thread: %s: %s\n", combs_status_str(r->status), combs_last_error());
    return NULL;
}

static int same(const char *what, const struct run *a, const struct run *b) {
    int ok = a->n_out == b->n_out && memcmp(a->out, b->out, sizeof(combs_token) * (size_t)a->n_out) == 0;
    printf("%s %s: %d tokens [", ok ? "ok  " : "FAIL", what, b->n_out);
    for (int i = 0; i < b->n_out; i++) printf("%s%d", i ? " " : "", b->out[i]);
    printf("]\n");
    return ok;
}

#define CHECK(call)                                                                                     \
    do {                                                                                                \
        combs_status s_ = (call);                                                                       \
        if (s_ != COMBS_OK) {                                                                           \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, combs_status_str(s_), \
                    combs_last_error());                                                                \
            return 1;                                                                                   \
        }                                                                                               \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [N_TOKENS]\n", argv[0]);
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 8;
    if (n < 1 || n > MAX_TOKENS) n = 8;
    combs_runtime *rt = NULL;
    combs_model *model = NULL;
    CHECK(combs_runtime_create(NULL, &rt));
    CHECK(combs_model_load(rt, argv[1], NULL, &model));
    const size_t n_vocab = (size_t)combs_model_n_vocab(model);

    /* Each prompt alone. Greedy decoding never samples an end token here
     * (it would be recorded like any other token). */
    struct run alone[2], inter[2], thr[2], bat[2], dev[2], devbat[2];
    for (int i = 0; i < 2; i++) {
        alone[i] = (struct run){.model = model, .prompt = PROMPTS[i], .n = n};
        CHECK(start(&alone[i]));
        for (int k = 0; k < n; k++) CHECK(step(&alone[i], n_vocab));
        finish(&alone[i]);
    }

    /* Interleaved: both sessions live, steps alternate. */
    for (int i = 0; i < 2; i++) {
        inter[i] = (struct run){.model = model, .prompt = PROMPTS[i], .n = n};
        CHECK(start(&inter[i]));
    }
    for (int k = 0; k < n; k++)
        for (int i = 0; i < 2; i++) CHECK(step(&inter[i], n_vocab));

    /* Two threads, one session each, through combs_generate. */
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        thr[i] = (struct run){.model = model, .prompt = PROMPTS[i], .n = n};
        pthread_create(&th[i], NULL, threaded, &thr[i]);
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);

    /* Batched: two paged sessions, one forward pass per step for both. */
    for (int i = 0; i < 2; i++) {
        bat[i] = (struct run){.model = model, .prompt = PROMPTS[i], .kv = COMBS_KV_PAGED, .n = n};
        CHECK(start(&bat[i]));
    }
    for (int k = 0; k < n; k++) {
        combs_session *ss[2] = {bat[0].session, bat[1].session};
        combs_token ts[2];
        for (int i = 0; i < 2; i++) {
            ts[i] = combs_sampler_sample(bat[i].sampler, combs_session_logits(bat[i].session), n_vocab);
            if (ts[i] < 0) return 1;
            bat[i].out[bat[i].n_out++] = ts[i];
        }
        CHECK(combs_batch_decode(model, ss, ts, 2));
    }

    /* Each alone, the next token drawn with the step (on the device). */
    for (int i = 0; i < 2; i++) {
        dev[i] = (struct run){.model = model, .prompt = PROMPTS[i], .n = n};
        CHECK(start(&dev[i]));
        combs_token t = combs_sampler_sample(dev[i].sampler, combs_session_logits(dev[i].session), n_vocab);
        for (int k = 0; k < n; k++) {
            dev[i].out[dev[i].n_out++] = t;
            CHECK(combs_session_decode_sample(dev[i].session, t, dev[i].sampler, &t));
        }
        if (combs_session_logits(dev[i].session) != NULL) {
            fprintf(stderr, "combs_session_logits after a step sampled on the device\n");
            return 1;
        }
    }

    /* Batched, the next tokens drawn with the step. */
    for (int i = 0; i < 2; i++) {
        devbat[i] = (struct run){.model = model, .prompt = PROMPTS[i], .kv = COMBS_KV_PAGED, .n = n};
        CHECK(start(&devbat[i]));
    }
    {
        combs_session *ss[2] = {devbat[0].session, devbat[1].session};
        combs_sampler *sm[2] = {devbat[0].sampler, devbat[1].sampler};
        combs_token ts[2];
        for (int i = 0; i < 2; i++)
            ts[i] = combs_sampler_sample(devbat[i].sampler, combs_session_logits(devbat[i].session), n_vocab);
        for (int k = 0; k < n; k++) {
            for (int i = 0; i < 2; i++) devbat[i].out[devbat[i].n_out++] = ts[i];
            CHECK(combs_batch_decode_sample(model, ss, sm, ts, 2, ts));
        }
    }

    /* The sessions keep the model alive: free it first, then keep decoding. */
    combs_model_free(model);
    combs_runtime_free(rt);
    CHECK(step(&inter[0], n_vocab));
    printf("ok   session still decodes after combs_model_free (len %zu)\n", combs_session_len(inter[0].session));
    inter[0].n_out--;

    int ok = 1;
    for (int i = 0; i < 2; i++) {
        char what[64];
        snprintf(what, sizeof what, "prompt %d interleaved == alone", i);
        ok &= same(what, &alone[i], &inter[i]);
        snprintf(what, sizeof what, "prompt %d threaded == alone", i);
        ok &= thr[i].status == COMBS_OK && same(what, &alone[i], &thr[i]);
        snprintf(what, sizeof what, "prompt %d batched == alone", i);
        ok &= same(what, &alone[i], &bat[i]);
        snprintf(what, sizeof what, "prompt %d sampled on the device == alone", i);
        ok &= same(what, &alone[i], &dev[i]);
        snprintf(what, sizeof what, "prompt %d batched, sampled on the device == alone", i);
        ok &= same(what, &alone[i], &devbat[i]);
        finish(&dev[i]);
        finish(&devbat[i]);
        finish(&inter[i]);
        finish(&thr[i]);
        finish(&bat[i]);
    }
    if (memcmp(alone[0].out, alone[1].out, sizeof(combs_token) * (size_t)n) == 0)
        printf("note: both prompts gave the same tokens (a random-weight model?): the test is weaker\n");
    printf("%s\n", ok ? "sessions: all runs agree" : "sessions: MISMATCH");
    return ok ? 0 : 1;
}
