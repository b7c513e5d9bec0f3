/* errors.c: every error path of the combs C API, each checked for its status
 * and for the text of combs_last_error(). Bad model files (missing, a
 * directory, empty, not GGUF, truncated, an unknown architecture) are
 * written into a temporary directory from the real model.
 *
 *   errors MODEL.gguf
 *
 * Prints one line per check; exits 1 if any check fails. */
#define _POSIX_C_SOURCE 200809L
#include <combs.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int n_failed, n_passed;

/* Checks a status and that the last error contains every given substring. */
static void check(int line, const char *expr, combs_status got, combs_status want, const char *sub1,
                  const char *sub2) {
    const char *msg = combs_last_error();
    int ok = got == want && (want == COMBS_OK || ((!sub1 || strstr(msg, sub1)) && (!sub2 || strstr(msg, sub2))));
    if (ok) {
        n_passed++;
        printf("ok   %-26s %s\n", combs_status_str(got), want == COMBS_OK ? expr : msg);
    } else {
        n_failed++;
        printf("FAIL line %d: %s\n     got %s, want %s\n     last error: %s\n     want text: \"%s\" \"%s\"\n", line,
               expr, combs_status_str(got), combs_status_str(want), msg, sub1 ? sub1 : "", sub2 ? sub2 : "");
    }
}
#define EXPECT(call, want, sub1, sub2) check(__LINE__, #call, (call), (want), (sub1), (sub2))

/* Checks a plain condition. */
static void truth(int line, const char *expr, int cond) {
    if (cond) {
        n_passed++;
        printf("ok   %-26s %s\n", "", expr);
    } else {
        n_failed++;
        printf("FAIL line %d: %s (last error: %s)\n", line, expr, combs_last_error());
    }
}
#define TRUE(cond) truth(__LINE__, #cond, (cond))

static int write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = n ? fwrite(data, 1, n, f) : 0;
    return fclose(f) == 0 && w == n ? 0 : -1;
}

static unsigned char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)len);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return buf;
}

/* The thread-local last error: a new thread starts with "". */
static void *fresh_thread(void *arg) {
    *(int *)arg = strcmp(combs_last_error(), "") == 0;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    const char *model_path = argv[1];
    char dir[] = "/tmp/combs-errors-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    char path[4096];
#define TMP(name) (snprintf(path, sizeof path, "%s/%s", dir, name), path)

    /* ---- status names, NULL-safe frees ---- */
    TRUE(strcmp(combs_status_str(COMBS_ERR_CONTEXT_FULL), "COMBS_ERR_CONTEXT_FULL") == 0);
    TRUE(strcmp(combs_status_str((combs_status)42), "COMBS_ERR_UNKNOWN") == 0);
    TRUE(strcmp(combs_last_error(), "") == 0);
    combs_runtime_free(NULL);
    combs_model_free(NULL);
    combs_session_free(NULL);
    combs_sampler_free(NULL);
    TRUE(strlen(combs_version()) > 0);

    /* ---- runtime ---- */
    combs_runtime *rt = (combs_runtime *)&n_failed; /* poison: must become NULL */
    combs_runtime_options ro = combs_runtime_default_options();
    EXPECT(combs_runtime_create(NULL, NULL), COMBS_ERR_INVALID_ARGUMENT, "combs_runtime_create", "`out`");
    ro.device_index = -2;
    EXPECT(combs_runtime_create(&ro, &rt), COMBS_ERR_INVALID_ARGUMENT, "device_index", "-2");
    TRUE(rt == NULL);
    ro.device_index = 99;
    EXPECT(combs_runtime_create(&ro, &rt), COMBS_ERR_INVALID_ARGUMENT, "device 99 does not exist", NULL);
    EXPECT(combs_runtime_create(NULL, &rt), COMBS_OK, NULL, NULL);
    if (!rt) return 1;

    /* ---- model files ---- */
    combs_model *m = (combs_model *)&n_failed;
    EXPECT(combs_model_load(NULL, model_path, NULL, &m), COMBS_ERR_INVALID_ARGUMENT, "combs_model_load", "`rt`");
    TRUE(m == NULL);
    EXPECT(combs_model_load(rt, NULL, NULL, &m), COMBS_ERR_INVALID_ARGUMENT, "`path`", "NULL");
    EXPECT(combs_model_load(rt, model_path, NULL, NULL), COMBS_ERR_INVALID_ARGUMENT, "`out`", NULL);
    EXPECT(combs_model_load(rt, TMP("missing.gguf"), NULL, &m), COMBS_ERR_IO, "missing.gguf", "No such file");
    EXPECT(combs_model_load(rt, dir, NULL, &m), COMBS_ERR_IO, dir, "directory");

    write_file(TMP("empty.gguf"), "", 0);
    EXPECT(combs_model_load(rt, TMP("empty.gguf"), NULL, &m), COMBS_ERR_FORMAT, "empty.gguf", "offset 0");

    const char text[] = "# not a model\nhello world, this is a text file\n";
    write_file(TMP("text.gguf"), text, sizeof text - 1);
    EXPECT(combs_model_load(rt, TMP("text.gguf"), NULL, &m), COMBS_ERR_FORMAT, "text.gguf", "magic");

    size_t n_bytes = 0;
    unsigned char *bytes = read_file(model_path, &n_bytes);
    TRUE(bytes != NULL && n_bytes > 4096);
    if (!bytes) return 1;
    /* Cut inside the metadata: the parser reports the byte offset. */
    write_file(TMP("truncated-header.gguf"), bytes, 1000);
    EXPECT(combs_model_load(rt, TMP("truncated-header.gguf"), NULL, &m), COMBS_ERR_FORMAT, "truncated-header.gguf",
           "offset");
    /* Cut inside the tensor data: the message names the tensor. */
    write_file(TMP("truncated-data.gguf"), bytes, n_bytes / 2);
    EXPECT(combs_model_load(rt, TMP("truncated-data.gguf"), NULL, &m), COMBS_ERR_FORMAT, "truncated-data.gguf",
           "tensor");
    /* general.architecture = "llama" patched to "llamx" (same length, rest intact). */
    static const char key[] = "general.architecture";
    unsigned char *at = NULL;
    for (size_t i = 0; i + sizeof key + 20 < n_bytes && i < (8u << 20); i++)
        if (memcmp(bytes + i, key, sizeof key - 1) == 0) {
            at = bytes + i + (sizeof key - 1) + 4 + 8; /* key, value type (u32), string length (u64) */
            break;
        }
    TRUE(at != NULL && memcmp(at, "llama", 5) == 0);
    if (at) {
        at[4] = 'x';
        write_file(TMP("unknown-arch.gguf"), bytes, n_bytes);
        EXPECT(combs_model_load(rt, TMP("unknown-arch.gguf"), NULL, &m), COMBS_ERR_UNSUPPORTED, "unknown-arch.gguf",
               "llamx");
    }
    free(bytes);
    TRUE(m == NULL);

    EXPECT(combs_model_load(rt, model_path, NULL, &m), COMBS_OK, NULL, NULL);
    if (!m) return 1;
    const int n_vocab = combs_model_n_vocab(m);
    TRUE(n_vocab > 0);
    TRUE(combs_model_n_vocab(NULL) == -1);
    TRUE(strstr(combs_last_error(), "combs_model_n_vocab") != NULL);
    TRUE(combs_model_token_bos(NULL) == -1);
    TRUE(!combs_model_token_is_eog(m, -1) && !combs_model_token_is_eog(m, n_vocab));
    TRUE(combs_model_token_is_eog(m, combs_model_token_eos(m)));

    /* ---- tokenize, pieces, templates ---- */
    const char *hello = "Hello world, how are you?";
    combs_token toks[64];
    size_t n_toks = 0;
    EXPECT(combs_tokenize(NULL, hello, strlen(hello), true, toks, 64, &n_toks), COMBS_ERR_INVALID_ARGUMENT, "`m`",
           NULL);
    EXPECT(combs_tokenize(m, hello, strlen(hello), true, toks, 64, NULL), COMBS_ERR_INVALID_ARGUMENT, "`n_out`",
           NULL);
    EXPECT(combs_tokenize(m, NULL, 5, true, toks, 64, &n_toks), COMBS_ERR_INVALID_ARGUMENT, "`text`", NULL);
    EXPECT(combs_tokenize(m, "\xff\xfe", 2, true, toks, 64, &n_toks), COMBS_ERR_INVALID_ARGUMENT, "UTF-8", NULL);
    EXPECT(combs_tokenize(m, hello, strlen(hello), false, toks, 2, &n_toks), COMBS_ERR_BUFFER_TOO_SMALL,
           "buffer too small", "2 given");
    size_t needed = n_toks;
    TRUE(needed > 2);
    EXPECT(combs_tokenize(m, hello, strlen(hello), false, toks, needed, &n_toks), COMBS_OK, NULL, NULL);
    TRUE(n_toks == needed);

    char piece[64];
    size_t len = 0;
    EXPECT(combs_token_to_piece(m, n_vocab, piece, sizeof piece, &len), COMBS_ERR_INVALID_ARGUMENT, "out of range",
           NULL);
    EXPECT(combs_token_to_piece(m, -1, piece, sizeof piece, &len), COMBS_ERR_INVALID_ARGUMENT, "token id -1", NULL);
    EXPECT(combs_token_to_piece(m, toks[1], piece, sizeof piece, NULL), COMBS_ERR_INVALID_ARGUMENT, "`len_out`",
           NULL);
    EXPECT(combs_token_to_piece(m, toks[1], piece, 1, &len), COMBS_ERR_BUFFER_TOO_SMALL, "combs_token_to_piece",
           "1 given");
    size_t piece_needed = len;
    TRUE(piece_needed >= 2);
    EXPECT(combs_token_to_piece(m, toks[1], piece, piece_needed, &len), COMBS_OK, NULL, NULL);
    TRUE(len == piece_needed - 1 && piece[len] == '\0');

    const char *roles[] = {"system", "user"};
    const char *contents[] = {"You are helpful.", "Hi!"};
    char tmpl[16];
    EXPECT(combs_chat_apply_template(m, roles, contents, 2, true, tmpl, sizeof tmpl, &len),
           COMBS_ERR_BUFFER_TOO_SMALL, "combs_chat_apply_template", "16 given");
    char *big = malloc(len);
    size_t tmpl_needed = len;
    EXPECT(combs_chat_apply_template(m, roles, contents, 2, true, big, tmpl_needed, &len), COMBS_OK, NULL, NULL);
    TRUE(len == tmpl_needed - 1 && strlen(big) == len && strstr(big, "Hi!") != NULL);
    free(big);
    EXPECT(combs_chat_apply_template(m, NULL, contents, 2, true, tmpl, sizeof tmpl, &len),
           COMBS_ERR_INVALID_ARGUMENT, "`roles`", NULL);
    const char *bad_roles[] = {"system", NULL};
    EXPECT(combs_chat_apply_template(m, bad_roles, contents, 2, true, tmpl, sizeof tmpl, &len),
           COMBS_ERR_INVALID_ARGUMENT, "roles[1] is NULL", NULL);

    /* ---- sessions ---- */
    combs_session *s = (combs_session *)&n_failed;
    combs_session_options so = combs_session_default_options();
    EXPECT(combs_session_create(NULL, &so, &s), COMBS_ERR_INVALID_ARGUMENT, "`m`", NULL);
    TRUE(s == NULL);
    so.kv_kind = (combs_kv_kind)7;
    EXPECT(combs_session_create(m, &so, &s), COMBS_ERR_INVALID_ARGUMENT, "kv_kind", "7");
    so = combs_session_default_options();
    so.page_size = 0;
    EXPECT(combs_session_create(m, &so, &s), COMBS_ERR_INVALID_ARGUMENT, "page_size", NULL);
    so = combs_session_default_options();
    so.kv_kind = COMBS_KV_PAGED;
    so.n_ctx = 64;
    so.page_size = 16;
    so.pool_pages = 5;
    combs_session *paged = NULL, *paged2 = NULL, *fork = NULL;
    EXPECT(combs_session_create(m, &so, &paged), COMBS_OK, NULL, NULL);
    EXPECT(combs_session_create(m, &so, &paged2), COMBS_OK, NULL, NULL);
    combs_page_stats ps;
    EXPECT(combs_session_page_stats(paged, &ps), COMBS_OK, NULL, NULL);
    TRUE(ps.pages_total == 5 && ps.pages_free == 5 && ps.sequences == 2 && ps.page_size == 16);
    EXPECT(combs_session_page_stats(paged, NULL), COMBS_ERR_INVALID_ARGUMENT, "`out`", NULL);

    so = combs_session_default_options();
    so.n_ctx = 8;
    EXPECT(combs_session_create(m, &so, &s), COMBS_OK, NULL, NULL);
    if (!s) return 1;
    TRUE(combs_session_logits(s) == NULL);
    TRUE(strstr(combs_last_error(), "no logits") != NULL);
    TRUE(combs_session_logits(NULL) == NULL);
    TRUE(combs_session_len(NULL) == 0);

    combs_sampler *greedy = NULL;
    combs_sampler_options po = combs_sampler_default_options();
    po.temperature = 0;
    EXPECT(combs_sampler_create(&po, &greedy), COMBS_OK, NULL, NULL);
    EXPECT(combs_generate(s, greedy, 4, NULL, NULL), COMBS_ERR_INVALID_ARGUMENT, "combs_generate", "prefill");

    combs_token nine[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    EXPECT(combs_session_prefill(s, nine, 9), COMBS_ERR_CONTEXT_FULL, "context is full", "8 positions");
    combs_token bad[3] = {toks[0], n_vocab + 5, toks[1]};
    EXPECT(combs_session_prefill(s, bad, 3), COMBS_ERR_INVALID_ARGUMENT, "tokens[1]", "out of range");
    bad[1] = -7;
    EXPECT(combs_session_prefill(s, bad, 3), COMBS_ERR_INVALID_ARGUMENT, "tokens[1]", "-7");
    EXPECT(combs_session_prefill(s, NULL, 3), COMBS_ERR_INVALID_ARGUMENT, "`tokens`", NULL);
    EXPECT(combs_session_prefill(NULL, toks, 3), COMBS_ERR_INVALID_ARGUMENT, "`s`", NULL);
    EXPECT(combs_session_decode(s, n_vocab), COMBS_ERR_INVALID_ARGUMENT, "combs_session_decode", "out of range");
    TRUE(combs_session_len(s) == 0);

    EXPECT(combs_session_prefill(s, toks, 4), COMBS_OK, NULL, NULL);
    TRUE(combs_session_len(s) == 4 && combs_session_logits(s) != NULL);
    EXPECT(combs_session_rewind(s, 5), COMBS_ERR_INVALID_ARGUMENT, "n_keep", "past the 4 positions");
    EXPECT(combs_session_rewind(NULL, 0), COMBS_ERR_INVALID_ARGUMENT, "`s`", NULL);
    EXPECT(combs_session_rewind(s, 2), COMBS_OK, NULL, NULL);
    TRUE(combs_session_len(s) == 2 && combs_session_logits(s) == NULL);
    EXPECT(combs_session_prefill(s, toks, 6), COMBS_OK, NULL, NULL);
    TRUE(combs_session_len(s) == 8);
    EXPECT(combs_session_decode(s, toks[0]), COMBS_ERR_CONTEXT_FULL, "combs_session_decode", "context is full");
    EXPECT(combs_generate(s, greedy, 4, NULL, NULL), COMBS_ERR_CONTEXT_FULL, "after 1 generated tokens",
           "context is full");
    EXPECT(combs_generate(NULL, greedy, 4, NULL, NULL), COMBS_ERR_INVALID_ARGUMENT, "`s`", NULL);
    EXPECT(combs_generate(s, NULL, 4, NULL, NULL), COMBS_ERR_INVALID_ARGUMENT, "`smp`", NULL);

    /* ---- samplers ---- */
    combs_sampler *smp = (combs_sampler *)&n_failed;
    po = combs_sampler_default_options();
    po.temperature = -0.5f;
    EXPECT(combs_sampler_create(&po, &smp), COMBS_ERR_INVALID_ARGUMENT, "temperature", "-0.5");
    TRUE(smp == NULL);
    po = combs_sampler_default_options();
    po.temperature = NAN;
    EXPECT(combs_sampler_create(&po, &smp), COMBS_ERR_INVALID_ARGUMENT, "temperature", "NaN");
    po = combs_sampler_default_options();
    po.top_p = 1.5f;
    EXPECT(combs_sampler_create(&po, &smp), COMBS_ERR_INVALID_ARGUMENT, "top_p", "1.5");
    po = combs_sampler_default_options();
    po.min_p = -0.1f;
    EXPECT(combs_sampler_create(&po, &smp), COMBS_ERR_INVALID_ARGUMENT, "min_p", NULL);
    po = combs_sampler_default_options();
    po.repeat_penalty = 0.0f;
    EXPECT(combs_sampler_create(&po, &smp), COMBS_ERR_INVALID_ARGUMENT, "repeat_penalty", NULL);
    po = combs_sampler_default_options();
    po.repeat_last_n = -2;
    EXPECT(combs_sampler_create(&po, &smp), COMBS_ERR_INVALID_ARGUMENT, "repeat_last_n", NULL);
    EXPECT(combs_sampler_create(NULL, NULL), COMBS_ERR_INVALID_ARGUMENT, "`out`", NULL);
    TRUE(combs_sampler_sample(greedy, NULL, 10) == -1);
    TRUE(strstr(combs_last_error(), "`logits`") != NULL);
    TRUE(combs_sampler_sample(NULL, combs_session_logits(s), (size_t)n_vocab) == -1);
    TRUE(strstr(combs_last_error(), "`smp`") != NULL);
    const float three[3] = {0.5f, 2.0f, -1.0f};
    TRUE(combs_sampler_sample(greedy, three, 3) == 1);
    EXPECT(combs_sampler_accept(greedy, -1), COMBS_ERR_INVALID_ARGUMENT, "combs_sampler_accept", "-1 is negative");

    /* ---- batch decode, forks and the page pool ---- */
    EXPECT(combs_batch_decode(m, NULL, NULL, 0), COMBS_OK, NULL, NULL);
    combs_session *batch[2] = {s, NULL};
    combs_token batch_toks[2] = {toks[0], toks[1]};
    EXPECT(combs_batch_decode(NULL, batch, batch_toks, 2), COMBS_ERR_INVALID_ARGUMENT, "`m`", NULL);
    EXPECT(combs_batch_decode(m, batch, batch_toks, 2), COMBS_ERR_INVALID_ARGUMENT, "sessions[1] is NULL", NULL);
    EXPECT(combs_batch_decode(m, NULL, batch_toks, 2), COMBS_ERR_INVALID_ARGUMENT, "`sessions`", NULL);
    batch[1] = s;
    EXPECT(combs_batch_decode(m, batch, batch_toks, 2), COMBS_ERR_INVALID_ARGUMENT, "listed twice", NULL);
    batch_toks[0] = -3;
    EXPECT(combs_batch_decode(m, batch, batch_toks, 1), COMBS_ERR_INVALID_ARGUMENT, "tokens[0]", "-3");
    batch_toks[0] = toks[0];
    EXPECT(combs_batch_decode(m, batch, batch_toks, 1), COMBS_ERR_INVALID_ARGUMENT, "contiguous", NULL);
    EXPECT(combs_session_page_stats(s, &ps), COMBS_ERR_INVALID_ARGUMENT, "page pool", NULL);
    /* 5 pages of 16: 40 + 30 positions take 3 + 2 of them */
    combs_token prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = toks[i % 2];
    EXPECT(combs_session_prefill(paged, prompt, 40), COMBS_OK, NULL, NULL);
    EXPECT(combs_session_prefill(paged2, prompt, 30), COMBS_OK, NULL, NULL);
    EXPECT(combs_session_fork(paged, NULL), COMBS_ERR_INVALID_ARGUMENT, "`out`", NULL);
    EXPECT(combs_session_fork(NULL, &fork), COMBS_ERR_INVALID_ARGUMENT, "`s`", NULL);
    EXPECT(combs_session_fork(paged, &fork), COMBS_OK, NULL, NULL);
    TRUE(combs_session_len(fork) == 40 && combs_session_logits(fork) != NULL);
    /* the fork writes into the shared partial page: a copy needs a page, none is free */
    EXPECT(combs_session_decode(fork, toks[0]), COMBS_ERR_OUT_OF_MEMORY, "kv pages", NULL);
    TRUE(combs_session_len(fork) == 40 && combs_session_logits(fork) != NULL);
    combs_session_free(fork); /* gives its reference to the shared pages back */
    batch[0] = paged;
    batch[1] = paged2;
    batch_toks[0] = toks[0];
    batch_toks[1] = toks[1];
    EXPECT(combs_batch_decode(m, batch, batch_toks, 2), COMBS_OK, NULL, NULL);
    TRUE(combs_session_len(paged) == 41 && combs_session_len(paged2) == 31);
    TRUE(combs_session_logits(paged) != NULL && combs_session_logits(paged2) != NULL);
    EXPECT(combs_session_page_stats(paged, &ps), COMBS_OK, NULL, NULL);
    TRUE(ps.pages_used == 5 && ps.sequences == 2 && ps.tokens == 72 && ps.bytes_used > 0);
    combs_session_free(paged2);
    combs_session_free(paged);

    /* ---- the last error is per thread ---- */
    int fresh = 0;
    pthread_t th;
    pthread_create(&th, NULL, fresh_thread, &fresh);
    pthread_join(th, NULL);
    TRUE(fresh);
    TRUE(strstr(combs_last_error(), "combs_session_decode") != NULL);

    combs_sampler_free(greedy);
    combs_session_free(s);
    combs_model_free(m);
    combs_runtime_free(rt);

    const char *names[] = {"empty.gguf", "text.gguf", "truncated-header.gguf", "truncated-data.gguf",
                           "unknown-arch.gguf"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) unlink(TMP(names[i]));
    rmdir(dir);

    printf("%d checks passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
