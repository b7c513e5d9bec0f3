/* describe_image.c: a vision-language model through the combs C API — load
 * a SmolVLM text model and its projector (llama.cpp's mmproj GGUF), decode
 * an image, render a chat turn whose user message holds "<image>" where the
 * picture goes, prefill text and image together, and generate the answer
 * greedily:
 *
 *   describe_image TEXT.gguf MMPROJ.gguf IMAGE.png [N_TOKENS] [QUESTION]
 *
 * The answer equals `combs run -m TEXT --mmproj MMPROJ --image IMAGE --chat
 * -p QUESTION -n N_TOKENS --temp 0`. Then checks that bad input is refused
 * with a clear error (a 0x0 and a huge image, corrupt image bytes, more
 * images than markers, images without a projector, a text model's file as
 * the projector) and prints "N tokens, bad input refused" for ctest. */
#include <combs.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, combs_status s) {
    fprintf(stderr, "describe_image: %s failed: %s: %s\n", what, combs_status_str(s), combs_last_error());
    return 1;
}

static bool print_piece(combs_token t, const char *piece, size_t len, void *user_data) {
    (void)t;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    ++*(int *)user_data;
    return true;
}

/* One bad-input check: `got` must be `want`, with a message. */
static int expect(const char *what, combs_status got, combs_status want) {
    if (got == want && strlen(combs_last_error()) > 0) {
        fprintf(stderr, "  refused as expected: %s: %s\n", what, combs_last_error());
        return 0;
    }
    fprintf(stderr, "describe_image: %s gave %s, expected %s\n", what, combs_status_str(got),
            combs_status_str(want));
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TEXT.gguf MMPROJ.gguf IMAGE [N_TOKENS] [QUESTION]\n", argv[0]);
        return 2;
    }
    const char *text_path = argv[1], *mmproj_path = argv[2], *image_path = argv[3];
    int n_predict = argc > 4 ? atoi(argv[4]) : 32;
    const char *question = argc > 5 ? argv[5] : "Can you describe this image?";

    int rc = 1, n_generated = 0, bad = 0;
    combs_runtime *rt = NULL;
    combs_model *model = NULL;
    combs_mmproj *mmproj = NULL, *wrong = NULL;
    combs_image *image = NULL, *corrupt = NULL;
    combs_session *session = NULL;
    combs_sampler *sampler = NULL;
    char *turn = NULL, *message = NULL;
    combs_status s;

    if ((s = combs_runtime_create(NULL, &rt)) != COMBS_OK) { rc = fail("combs_runtime_create", s); goto done; }
    if ((s = combs_model_load(rt, text_path, NULL, &model)) != COMBS_OK) { rc = fail("combs_model_load", s); goto done; }
    if ((s = combs_mmproj_load(model, mmproj_path, &mmproj)) != COMBS_OK) { rc = fail("combs_mmproj_load", s); goto done; }
    if ((s = combs_image_load(image_path, &image)) != COMBS_OK) { rc = fail("combs_image_load", s); goto done; }
    fprintf(stderr, "image: %ux%u\n", combs_image_width(image), combs_image_height(image));

    /* The user's message: the picture first, then the question. */
    size_t mlen = strlen("<image>") + strlen(question) + 1;
    message = malloc(mlen);
    if (!message) goto done;
    snprintf(message, mlen, "<image>%s", question);
    const char *roles[] = {"user"};
    const char *contents[] = {message};
    size_t len = 0;
    s = combs_chat_apply_template(model, roles, contents, 1, true, NULL, 0, &len);
    if (s != COMBS_ERR_BUFFER_TOO_SMALL) { rc = fail("combs_chat_apply_template", s); goto done; }
    turn = malloc(len);
    if (!turn) goto done;
    if ((s = combs_chat_apply_template(model, roles, contents, 1, true, turn, len, &len)) != COMBS_OK) {
        rc = fail("combs_chat_apply_template", s);
        goto done;
    }

    combs_session_options sopts = combs_session_default_options();
    sopts.n_ctx = 4096;
    if ((s = combs_session_create(model, &sopts, &session)) != COMBS_OK) { rc = fail("combs_session_create", s); goto done; }
    const combs_image *images[] = {image};
    if ((s = combs_session_prefill_multimodal(session, mmproj, turn, images, 1, true)) != COMBS_OK) {
        rc = fail("combs_session_prefill_multimodal", s);
        goto done;
    }
    fprintf(stderr, "prompt: %zu positions\n", combs_session_len(session));

    combs_sampler_options popts = combs_sampler_default_options();
    popts.temperature = 0.0f;
    if ((s = combs_sampler_create(&popts, &sampler)) != COMBS_OK) { rc = fail("combs_sampler_create", s); goto done; }
    if ((s = combs_generate(session, sampler, (size_t)n_predict, print_piece, &n_generated)) != COMBS_OK) {
        rc = fail("combs_generate", s);
        goto done;
    }
    fputc('\n', stdout);

    /* Bad input: each refused with a status and a message, the session as it was. */
    size_t before = combs_session_len(session);
    static const unsigned char pixel[3] = {1, 2, 3};
    bad += expect("a 0x0 image", combs_session_prefill_image(session, mmproj, pixel, 0, 0),
                  COMBS_ERR_INVALID_ARGUMENT);
    bad += expect("a 100000x100000 image", combs_session_prefill_image(session, mmproj, pixel, 100000, 100000),
                  COMBS_ERR_INVALID_ARGUMENT);
    static const unsigned char not_png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H'};
    bad += expect("a truncated PNG", combs_image_decode(not_png, sizeof not_png, &corrupt), COMBS_ERR_FORMAT);
    bad += expect("two images, one marker",
                  combs_session_prefill_multimodal(session, mmproj, "<image>",
                                                   (const combs_image *[]){image, image}, 2, false),
                  COMBS_ERR_INVALID_ARGUMENT);
    bad += expect("an image without a projector",
                  combs_session_prefill_multimodal(session, NULL, "<image>", images, 1, false),
                  COMBS_ERR_INVALID_ARGUMENT);
    bad += expect("a text model as the projector", combs_mmproj_load(model, text_path, &wrong), COMBS_ERR_UNSUPPORTED);
    if (combs_session_len(session) != before) {
        fprintf(stderr, "describe_image: a refused call changed the session\n");
        bad++;
    }
    if (bad) goto done;
    printf("%d tokens, bad input refused\n", n_generated);
    rc = 0;

done:
    free(turn);
    free(message);
    combs_sampler_free(sampler);
    combs_session_free(session);
    combs_image_free(corrupt);
    combs_image_free(image);
    combs_mmproj_free(wrong);
    combs_mmproj_free(mmproj);
    combs_model_free(model);
    combs_runtime_free(rt);
    return rc;
}
