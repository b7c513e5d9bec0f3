/* hello.c: the README's example — complete a prompt with combs_generate. */
#include <combs.h>
#include <stdio.h>
#include <string.h>

static bool print_piece(combs_token t, const char *piece, size_t len, void *user) {
    (void)t, (void)user;
    fwrite(piece, 1, len, stdout);
    return true; /* false stops generation */
}

int main(int argc, char **argv) {
    const char *prompt = "The three primary colors are";
    combs_runtime *rt = NULL; combs_model *m = NULL; combs_session *s = NULL; combs_sampler *smp = NULL;
    combs_token toks[256]; size_t n = 0;
    combs_status st = combs_runtime_create(NULL, &rt);
    if (!st) st = combs_model_load(rt, argc > 1 ? argv[1] : "model.gguf", NULL, &m);
    if (!st) st = combs_tokenize(m, prompt, strlen(prompt), true, toks, 256, &n);
    if (!st) st = combs_session_create(m, NULL, &s);
    if (!st) st = combs_sampler_create(NULL, &smp);   /* defaults: temperature 0.8, top-k 40, ... */
    if (!st) st = combs_session_prefill(s, toks, n);
    if (!st) { printf("%s", prompt); st = combs_generate(s, smp, 16, print_piece, NULL); printf("\n"); }
    if (st) fprintf(stderr, "error: %s: %s\n", combs_status_str(st), combs_last_error());
    combs_sampler_free(smp); combs_session_free(s); combs_model_free(m); combs_runtime_free(rt);
    return st ? 1 : 0;
}
