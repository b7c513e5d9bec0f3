//! The text that stands for one image in an Idefics3 / SmolVLM prompt:
//! the `<image>` placeholders the image embeddings replace, framed by the
//! tile markers the model was trained with.
//!
//! transformers (`Idefics3Processor.replace_image_token`) writes `\n` after
//! every row, then `\n` before the global view; mtmd writes `\n` after
//! every row but the last, then `\n\n` before the global view. The strings
//! are the same. For an image that fits one tile (rows = cols = 0)
//! transformers writes the global-only form; mtmd never has that case for
//! Idefics3 (it always cuts a grid, 1×1 at least), and the issue names the
//! global-only form, so that is what is written.

/// Marks the start and end of each image part.
pub const FAKE_TOKEN_AROUND_IMAGE: &str = "<fake_token_around_image>";
/// Precedes the global view's placeholders.
pub const GLOBAL_IMAGE_TOKEN: &str = "<global-img>";
/// One placeholder per image embedding.
pub const IMAGE_TOKEN: &str = "<image>";

/// The prompt text for one image of `rows` × `cols` tiles (plus the global
/// view), each tile `image_seq_len` embeddings (64 for SmolVLM's 512-px
/// tiles). `rows == 0` or `cols == 0` gives the global-only form.
pub fn image_prompt_expansion(rows: u32, cols: u32, image_seq_len: usize) -> String {
    let placeholders = IMAGE_TOKEN.repeat(image_seq_len);
    let global = format!(
        "{FAKE_TOKEN_AROUND_IMAGE}{GLOBAL_IMAGE_TOKEN}{placeholders}{FAKE_TOKEN_AROUND_IMAGE}"
    );
    if rows == 0 || cols == 0 {
        return global;
    }
    let mut text = String::with_capacity(
        (rows as usize * cols as usize + 1) * (placeholders.len() + 48) + rows as usize + 2,
    );
    for r in 1..=rows {
        for c in 1..=cols {
            text.push_str(FAKE_TOKEN_AROUND_IMAGE);
            text.push_str(&format!("<row_{r}_col_{c}>"));
            text.push_str(&placeholders);
        }
        if r < rows {
            text.push('\n');
        }
    }
    text.push_str("\n\n");
    text.push_str(&global);
    text
}
