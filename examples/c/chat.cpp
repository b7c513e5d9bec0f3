// chat.cpp: the combs C API from C++ — RAII ownership of every handle
// (std::unique_ptr with the library's free functions as deleters), errors as
// exceptions carrying combs_last_error(), the model's chat template, and
// streaming generation through a lambda.
//
//   chat MODEL.gguf [USER_MESSAGE] [N_TOKENS]
//
// Prints the assistant's reply (greedy), then a newline: the same text as
// `combs run -m MODEL.gguf --chat -p USER_MESSAGE -n N_TOKENS --temp 0 -c 512`.
#include <combs.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace combs {

// A failed call: the status and the library's message for it.
class Error : public std::runtime_error {
public:
    Error(const char *what, combs_status s)
        : std::runtime_error(std::string(what) + ": " + combs_status_str(s) + ": " + combs_last_error()),
          status(s) {}
    combs_status status;
};

inline void check(combs_status s, const char *what) {
    if (s != COMBS_OK) throw Error(what, s);
}

// Deleter calling the library's free function; free(NULL) is a no-op there.
template <auto Free>
struct Deleter {
    template <class T>
    void operator()(T *p) const noexcept { Free(p); }
};

using RuntimePtr = std::unique_ptr<combs_runtime, Deleter<combs_runtime_free>>;
using ModelPtr = std::unique_ptr<combs_model, Deleter<combs_model_free>>;
using SessionPtr = std::unique_ptr<combs_session, Deleter<combs_session_free>>;
using SamplerPtr = std::unique_ptr<combs_sampler, Deleter<combs_sampler_free>>;

inline RuntimePtr make_runtime(const combs_runtime_options &opts = combs_runtime_default_options()) {
    combs_runtime *rt = nullptr;
    check(combs_runtime_create(&opts, &rt), "combs_runtime_create");
    return RuntimePtr(rt);
}

inline ModelPtr load_model(combs_runtime *rt, const std::string &path) {
    combs_model *m = nullptr;
    check(combs_model_load(rt, path.c_str(), nullptr, &m), "combs_model_load");
    return ModelPtr(m);
}

inline SessionPtr make_session(combs_model *m, uint32_t n_ctx) {
    combs_session_options opts = combs_session_default_options();
    opts.n_ctx = n_ctx;
    combs_session *s = nullptr;
    check(combs_session_create(m, &opts, &s), "combs_session_create");
    return SessionPtr(s);
}

inline SamplerPtr make_sampler(const combs_sampler_options &opts) {
    combs_sampler *smp = nullptr;
    check(combs_sampler_create(&opts, &smp), "combs_sampler_create");
    return SamplerPtr(smp);
}

inline std::vector<combs_token> tokenize(const combs_model *m, std::string_view text, bool add_special) {
    size_t n = 0;
    combs_status s = combs_tokenize(m, text.data(), text.size(), add_special, nullptr, 0, &n);
    if (s != COMBS_ERR_BUFFER_TOO_SMALL) check(s, "combs_tokenize");
    std::vector<combs_token> out(n);
    check(combs_tokenize(m, text.data(), text.size(), add_special, out.data(), out.size(), &n), "combs_tokenize");
    out.resize(n);
    return out;
}

struct Message {
    std::string role, content;
};

inline std::string apply_template(const combs_model *m, const std::vector<Message> &msgs, bool add_generation_prompt) {
    std::vector<const char *> roles, contents;
    for (const auto &msg : msgs) {
        roles.push_back(msg.role.c_str());
        contents.push_back(msg.content.c_str());
    }
    std::string out(256, '\0');
    size_t len = 0;
    combs_status s = combs_chat_apply_template(m, roles.data(), contents.data(), msgs.size(), add_generation_prompt,
                                               out.data(), out.size(), &len);
    if (s == COMBS_ERR_BUFFER_TOO_SMALL) {  // len is the capacity needed
        out.resize(len);
        s = combs_chat_apply_template(m, roles.data(), contents.data(), msgs.size(), add_generation_prompt,
                                      out.data(), out.size(), &len);
    }
    check(s, "combs_chat_apply_template");
    out.resize(len);
    return out;
}

// Streams generated text to `on_piece(token, text) -> bool`; an exception
// thrown by it stops generation and is rethrown here (it must not cross the
// C library).
template <class F>
void generate(combs_session *s, combs_sampler *smp, size_t max_tokens, F &&on_piece) {
    struct Ctx {
        F &f;
        std::exception_ptr error;
    } ctx{on_piece, nullptr};
    auto trampoline = [](combs_token t, const char *piece, size_t len, void *user) noexcept -> bool {
        auto *c = static_cast<Ctx *>(user);
        try {
            return c->f(t, std::string_view(piece, len));
        } catch (...) {
            c->error = std::current_exception();
            return false;
        }
    };
    combs_status st = combs_generate(s, smp, max_tokens, trampoline, &ctx);
    if (ctx.error) std::rethrow_exception(ctx.error);
    check(st, "combs_generate");
}

}  // namespace combs

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s MODEL.gguf [USER_MESSAGE] [N_TOKENS]\n", argv[0]);
        return 2;
    }
    const std::string path = argv[1];
    const std::string user = argc > 2 ? argv[2] : "What is the capital of France?";
    const size_t n_predict = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 16;
    try {
        auto rt = combs::make_runtime();
        auto model = combs::load_model(rt.get(), path);
        rt.reset();  // the model keeps the device alive

        const std::string prompt = combs::apply_template(model.get(), {{"user", user}}, true);
        const auto tokens = combs::tokenize(model.get(), prompt, true);
        std::fprintf(stderr, "[chat] prompt: %zu tokens\n", tokens.size());

        auto session = combs::make_session(model.get(), 512);
        combs_sampler_options greedy = combs_sampler_default_options();
        greedy.temperature = 0.0f;
        auto sampler = combs::make_sampler(greedy);

        combs::check(combs_session_prefill(session.get(), tokens.data(), tokens.size()), "combs_session_prefill");
        size_t n_generated = 0;
        combs::generate(session.get(), sampler.get(), n_predict, [&](combs_token, std::string_view text) {
            std::fwrite(text.data(), 1, text.size(), stdout);
            std::fflush(stdout);
            ++n_generated;
            return true;
        });
        std::fputc('\n', stdout);
        std::fprintf(stderr, "[chat] %zu tokens generated; session holds %zu\n", n_generated,
                     combs_session_len(session.get()));
    } catch (const std::exception &e) {
        std::fprintf(stderr, "chat: %s\n", e.what());
        return 1;
    }
    return 0;
}
