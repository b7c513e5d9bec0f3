// mtmd's idefics3 preprocessing of one image, as uint8 tiles: the size steps of
// mtmd_image_preprocessor_idefics3::preprocess (tools/mtmd/mtmd-image.cpp,
// longest-edge path) around mtmd's own img_tool resize (its port of Pillow's
// resampler) and crop, compiled in from that file, on pixels decoded by
// stb_image as mtmd-helper does. Shows whether mtmd's tiles equal PIL's.
//
//   mtmd_preproc IMAGE LONGEST_EDGE TILE OUT_DIR
//
// Writes OUT_DIR/tile_KK.rgb (RGB8, TILE x TILE) in transformers' order: the
// row-major grid tiles, then the global view; prints "rows cols" on stdout.
#include "mtmd-image.cpp"

#define STB_IMAGE_IMPLEMENTATION
#include "stb/stb_image.h"

#include <cstdio>
#include <string>

static bool dump(const clip_image_u8 & img, const std::string & path) {
    const auto & buf = img.get_ro_buf();
    FILE * f = fopen(path.c_str(), "wb");
    if (!f) {
        return false;
    }
    const bool ok = fwrite(buf.data(), 1, buf.size(), f) == buf.size();
    return fclose(f) == 0 && ok;
}

int main(int argc, char ** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s IMAGE LONGEST_EDGE TILE OUT_DIR\n", argv[0]);
        return 2;
    }
    int w = 0, h = 0, n = 0;
    unsigned char * px = stbi_load(argv[1], &w, &h, &n, 3);
    if (!px) {
        fprintf(stderr, "cannot decode %s\n", argv[1]);
        return 1;
    }
    const int longest_edge = atoi(argv[2]);
    const int tile = atoi(argv[3]);
    const std::string out = argv[4];

    clip_image_u8 img;
    img.set_size({w, h}, false);
    img.cpy_buf(std::vector<uint8_t>(px, px + (size_t) w * h * 3));
    stbi_image_free(px);

    const double aspect = (double) w / h;
    clip_image_size rs;
    if (w >= h) {
        rs.width = longest_edge;
        rs.height = (int) (longest_edge / aspect);
        rs.height += rs.height % 2;
    } else {
        rs.height = longest_edge;
        rs.width = (int) (longest_edge * aspect);
        rs.width += rs.width % 2;
    }
    const int gx = (rs.width + tile - 1) / tile;
    const int gy = (rs.height + tile - 1) / tile;
    clip_image_u8 resized, refined, overview;
    img_tool::resize(img, resized, rs, RESIZE_ALGO_LANCZOS, PAD_NONE);
    img_tool::resize(resized, refined, {gx * tile, gy * tile}, RESIZE_ALGO_LANCZOS, PAD_NONE);
    img_tool::resize(refined, overview, {tile, tile}, RESIZE_ALGO_LANCZOS, PAD_NONE);
    int k = 0;
    char name[64];
    for (int y = 0; y < gy; y++) {
        for (int x = 0; x < gx; x++) {
            clip_image_u8 s;
            img_tool::crop(refined, s, x * tile, y * tile, tile, tile);
            snprintf(name, sizeof(name), "/tile_%02d.rgb", k++);
            if (!dump(s, out + name)) {
                return 1;
            }
        }
    }
    snprintf(name, sizeof(name), "/tile_%02d.rgb", k);
    if (!dump(overview, out + name)) {
        return 1;
    }
    printf("%d %d\n", gy, gx);
    return 0;
}
