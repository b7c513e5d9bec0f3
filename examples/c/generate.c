/* generate.c: the smallest complete use of the combs C API — load a model,
 * tokenize a prompt, prefill it, then sample and decode token by token,
 * printing each token's text as it comes.
 *
 *   generate MODEL.gguf [PROMPT] [N_TOKENS] [TEMPERATURE]
 *
 * With temperature 0 (the default here) the output equals
 * `combs run -m MODEL.gguf -p PROMPT -n N_TOKENS --temp 0 -c 512`
 * (the prompt, the generated text, a newline); ctest checks that. */
#include <combs.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, combs_status s) {
    fprintf(stderr, "generate: %s failed: %s: %s\n", what, combs_status_str(s), combs_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [PROMPT] [N_TOKENS] [TEMPERATURE]\n", argv[0]);
        return 2;
    }
    const char *model_path = argv[1];
    const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
    int n_predict = argc > 3 ? atoi(argv[3]) : 16;
    float temperature = argc > 4 ? (float)atof(argv[4]) : 0.0f;

    int rc = 1;
    combs_runtime *rt = NULL;
    combs_model *model = NULL;
    combs_session *session = NULL;
    combs_sampler *sampler = NULL;
    combs_token *tokens = NULL;
    char *piece = NULL;
    combs_status s;

    if ((s = combs_runtime_create(NULL, &rt)) != COMBS_OK) { rc = fail("combs_runtime_create", s); goto done; }
    if ((s = combs_model_load(rt, model_path, NULL, &model)) != COMBS_OK) { rc = fail("combs_model_load", s); goto done; }

    /* Ask for the token count first (cap 0), then tokenize into a buffer of that size. */
    size_t n_prompt = 0;
    s = combs_tokenize(model, prompt, strlen(prompt), true, NULL, 0, &n_prompt);
    if (s != COMBS_ERR_BUFFER_TOO_SMALL && s != COMBS_OK) { rc = fail("combs_tokenize", s); goto done; }
    tokens = malloc((n_prompt ? n_prompt : 1) * sizeof *tokens);
    if (!tokens) goto done;
    if ((s = combs_tokenize(model, prompt, strlen(prompt), true, tokens, n_prompt, &n_prompt)) != COMBS_OK) {
        rc = fail("combs_tokenize", s);
        goto done;
    }

    combs_session_options sopts = combs_session_default_options();
    sopts.n_ctx = 512;
    if ((s = combs_session_create(model, &sopts, &session)) != COMBS_OK) { rc = fail("combs_session_create", s); goto done; }

    combs_sampler_options popts = combs_sampler_default_options();
    popts.temperature = temperature;
    if ((s = combs_sampler_create(&popts, &sampler)) != COMBS_OK) { rc = fail("combs_sampler_create", s); goto done; }
    for (size_t i = 0; i < n_prompt; i++) combs_sampler_accept(sampler, tokens[i]);

    fputs(prompt, stdout);
    fflush(stdout);
    if ((s = combs_session_prefill(session, tokens, n_prompt)) != COMBS_OK) { rc = fail("combs_session_prefill", s); goto done; }

    const size_t n_vocab = (size_t)combs_model_n_vocab(model);
    size_t piece_cap = 64;
    piece = malloc(piece_cap);
    if (!piece) goto done;
    for (int i = 0; i < n_predict; i++) {
        const float *logits = combs_session_logits(session); /* valid until the next decode */
        combs_token t = combs_sampler_sample(sampler, logits, n_vocab);
        if (t < 0) { rc = fail("combs_sampler_sample", COMBS_ERR_INVALID_ARGUMENT); goto done; }
        if (combs_model_token_is_eog(model, t)) break;

        size_t len = 0;
        s = combs_token_to_piece(model, t, piece, piece_cap, &len);
        if (s == COMBS_ERR_BUFFER_TOO_SMALL) { /* len is the capacity needed */
            char *bigger = realloc(piece, len);
            if (!bigger) goto done;
            piece = bigger;
            piece_cap = len;
            s = combs_token_to_piece(model, t, piece, piece_cap, &len);
        }
        if (s != COMBS_OK) { rc = fail("combs_token_to_piece", s); goto done; }
        fwrite(piece, 1, len, stdout);
        fflush(stdout);

        if (combs_session_len(session) >= combs_session_n_ctx(session)) break;
        if ((s = combs_session_decode(session, t)) != COMBS_OK) { rc = fail("combs_session_decode", s); goto done; }
    }
    fputc('\n', stdout);
    rc = 0;

done:
    free(piece);
    free(tokens);
    combs_sampler_free(sampler);
    combs_session_free(session);
    combs_model_free(model);
    combs_runtime_free(rt);
    return rc;
}
