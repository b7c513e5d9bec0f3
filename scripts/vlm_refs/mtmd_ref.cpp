// Reference outputs of llama.cpp's mtmd (libmtmd) for the SmolVLM fixtures:
// how mtmd splits a prompt with one image into text and image chunks (token
// ids), the image embeddings of every chunk after the projector, the
// last-position logits after prefilling the whole prompt, and greedy tokens.
//
//   mtmd_ref TEXT.gguf MMPROJ.gguf IMAGE PROMPT_FILE N_PREDICT OUT_DIR
//
// PROMPT_FILE holds the prompt text with "<__media__>" where the image goes
// (special tokens are parsed, no BOS is added: the text is already the whole
// prompt). Writes OUT_DIR/mtmd.json and, per image chunk k (in prompt order),
// OUT_DIR/mtmd_embd_<k>.f32 (n_tokens x n_embd, little-endian f32), and
// OUT_DIR/mtmd_last_logits.f32 (n_vocab f32) and OUT_DIR/mtmd_decoded.rgb (the
// image as mtmd decoded it, RGB8 row-major). Built by
// scripts/make-vlm-fixtures.py against the CPU build of scripts/setup-llamacpp.sh.
#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static void quiet_log(enum ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static bool write_f32(const std::string & path, const float * data, size_t n) {
    FILE * f = fopen(path.c_str(), "wb");
    if (!f) {
        return false;
    }
    bool ok = fwrite(data, sizeof(float), n, f) == n;
    return fclose(f) == 0 && ok;
}

int main(int argc, char ** argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s TEXT.gguf MMPROJ.gguf IMAGE PROMPT_FILE N_PREDICT OUT_DIR\n", argv[0]);
        return 2;
    }
    const std::string out_dir = argv[6];
    const int n_predict = atoi(argv[5]);
    std::ifstream pf(argv[4], std::ios::binary);
    std::stringstream ss;
    ss << pf.rdbuf();
    const std::string prompt = ss.str();

    llama_log_set(quiet_log, nullptr);
    mtmd_helper_log_set(quiet_log, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 8192;
    cp.n_batch = 2048;
    cp.n_ubatch = 2048;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    llama_context * lctx = llama_init_from_model(model, cp);
    if (!lctx) {
        fprintf(stderr, "cannot create a llama context\n");
        return 1;
    }

    mtmd_context_params mcp = mtmd_context_params_default();
    mcp.use_gpu = false;
    mcp.print_timings = false;
    mcp.n_threads = 2;
    mcp.warmup = false;
    mtmd_context * mctx = mtmd_init_from_file(argv[2], model, mcp);
    if (!mctx) {
        fprintf(stderr, "cannot load %s\n", argv[2]);
        return 1;
    }

    mtmd_helper_bitmap_wrapper bw = mtmd_helper_bitmap_init_from_file(mctx, argv[3], false, mtmd_helper_init_opt_default());
    if (!bw.bitmap) {
        fprintf(stderr, "cannot decode %s\n", argv[3]);
        return 1;
    }

    // the decoded pixels (stb_image), to tell decoder differences from preprocessing ones
    {
        FILE * f = fopen((out_dir + "/mtmd_decoded.rgb").c_str(), "wb");
        const size_t n = mtmd_bitmap_get_n_bytes(bw.bitmap);
        if (!f || fwrite(mtmd_bitmap_get_data(bw.bitmap), 1, n, f) != n || fclose(f) != 0) {
            fprintf(stderr, "cannot write the decoded image\n");
            return 1;
        }
    }

    mtmd_input_chunks * chunks = mtmd_input_chunks_init();
    mtmd_input_text txt = { prompt.c_str(), prompt.size(), /*add_special*/ false, /*parse_special*/ true };
    const mtmd_bitmap * bitmaps[1] = { bw.bitmap };
    if (mtmd_tokenize(mctx, chunks, &txt, bitmaps, 1) != 0) {
        fprintf(stderr, "mtmd_tokenize failed\n");
        return 1;
    }

    const int n_embd = llama_model_n_embd_inp(model);
    std::ostringstream js;
    js << "{\n \"image_nx\": " << mtmd_bitmap_get_nx(bw.bitmap) << ", \"image_ny\": " << mtmd_bitmap_get_ny(bw.bitmap)
       << ",\n \"n_embd\": " << n_embd << ",\n \"chunks\": [";
    int n_img = 0;
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks, i);
        js << (i ? ",\n  " : "\n  ");
        if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t n = 0;
            const llama_token * t = mtmd_input_chunk_get_tokens_text(c, &n);
            js << "{\"type\": \"text\", \"tokens\": [";
            for (size_t j = 0; j < n; j++) {
                js << (j ? ", " : "") << t[j];
            }
            js << "]}";
        } else {
            const size_t n = mtmd_input_chunk_get_n_tokens(c);
            if (mtmd_encode_chunk(mctx, c) != 0) {
                fprintf(stderr, "mtmd_encode_chunk failed\n");
                return 1;
            }
            const std::string path = out_dir + "/mtmd_embd_" + std::to_string(n_img) + ".f32";
            if (!write_f32(path, mtmd_get_output_embd(mctx), n * n_embd)) {
                fprintf(stderr, "cannot write %s\n", path.c_str());
                return 1;
            }
            js << "{\"type\": \"image\", \"n_tokens\": " << n << ", \"embd_file\": \"mtmd_embd_" << n_img << ".f32\"}";
            n_img++;
        }
    }
    js << "\n ],\n";

    llama_pos n_past = 0;
    if (mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, cp.n_batch, true, &n_past) != 0) {
        fprintf(stderr, "mtmd_helper_eval_chunks failed\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(vocab);
    if (!write_f32(out_dir + "/mtmd_last_logits.f32", llama_get_logits_ith(lctx, -1), n_vocab)) {
        fprintf(stderr, "cannot write the logits\n");
        return 1;
    }
    js << " \"n_past\": " << n_past << ",\n \"n_vocab\": " << n_vocab << ",\n \"greedy\": [";
    for (int k = 0; k < n_predict; k++) {
        const float * lg = llama_get_logits_ith(lctx, -1);
        llama_token best = 0;
        for (int v = 1; v < n_vocab; v++) {
            if (lg[v] > lg[best]) {
                best = v;
            }
        }
        js << (k ? ", " : "") << best;
        llama_batch b = llama_batch_get_one(&best, 1);
        if (llama_decode(lctx, b) != 0) {
            fprintf(stderr, "llama_decode failed\n");
            return 1;
        }
    }
    js << "]\n}\n";
    std::ofstream(out_dir + "/mtmd.json") << js.str();

    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(bw.bitmap);
    mtmd_free(mctx);
    llama_free(lctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
