//! The chat template renderer on hostile templates and messages: whatever
//! the template does (deep recursion, long loops, huge strings), rendering
//! ends with text or an error, in bounded time and memory.
#![no_main]

#[path = "common.rs"]
mod common;

use combs::tokenizer::{ChatMessage, apply_chat_template};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let parts = common::split_parts(data, 4);
    let template = String::from_utf8_lossy(parts[0]);
    let messages: Vec<ChatMessage> = parts[1..]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let role = ["system", "user", "assistant"][i % 3];
            ChatMessage::new(role, String::from_utf8_lossy(p))
        })
        .collect();
    let add = data.first().is_some_and(|b| b & 1 != 0);
    if let Ok(out) = apply_chat_template(&template, &messages, add, "<s>", "</s>") {
        assert!(
            out.len() <= combs::tokenizer::MAX_CHAT_OUTPUT,
            "output bounded"
        );
    }
});
