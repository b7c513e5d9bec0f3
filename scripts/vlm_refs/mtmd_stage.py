"""The mtmd stage of scripts/make-vlm-fixtures.py: llama.cpp's mtmd (libmtmd,
llama-mtmd-cli; CPU build of scripts/setup-llamacpp.sh) on the converted tiny
SmolVLM GGUFs, compared with the transformers references already written.

Two small C++ programs beside this file do the work: mtmd_preproc.cpp (mtmd's
idefics3 tiles as uint8) and mtmd_ref.cpp (chunks, embeddings, logits,
greedy tokens).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_tool(name: str, llama_cpp: Path, build: Path, exe: Path) -> None:
    """Compiles scripts/vlm_refs/<name>.cpp against the CPU build's libmtmd/libllama."""
    src = Path(__file__).resolve().parent / f"{name}.cpp"
    if exe.exists() and exe.stat().st_mtime > src.stat().st_mtime:
        return
    inc = [llama_cpp / "include", llama_cpp / "ggml" / "include", llama_cpp / "tools" / "mtmd", llama_cpp / "vendor"]
    lib = build / "bin"
    cmd = ["g++", "-O2", "-std=c++17", str(src), "-o", str(exe), *[f"-I{p}" for p in inc],
           f"-L{lib}", "-lmtmd", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}"]
    subprocess.run(cmd, check=True)


def mtmd_tiles_vs_transformers(exe: Path, image: Path, entry: dict, fixtures: Path, wd: Path) -> dict:
    """mtmd's uint8 tiles of one image (stb decode) against transformers' tile PNGs."""
    import numpy as np
    from PIL import Image

    wd.mkdir(parents=True, exist_ok=True)
    rc = subprocess.run([str(exe), str(image), "2048", "512", str(wd)], check=True, capture_output=True, text=True)
    rows, cols = (int(x) for x in rc.stdout.split())
    diffs = []
    for k, t in enumerate(entry["tiles"]):
        a = np.asarray(Image.open(fixtures / t["png"])).astype(np.int16)
        b = np.fromfile(wd / f"tile_{k:02d}.rgb", dtype=np.uint8).reshape(a.shape).astype(np.int16)
        diffs.append(int(np.abs(a - b).max()))
    return {"rows": rows, "cols": cols, "grid_equal": [rows, cols] == [entry["rows"], entry["cols"]],
            "tile_max_abs_u8": diffs}


def run(args, image_token_id: int, n_greedy: int, gen_image: str) -> None:
    """The mtmd stage of make-vlm-fixtures.py: writes <fixtures>/mtmd.json."""
    import numpy as np

    fixtures = Path(args.fixtures)
    ref = json.loads((fixtures / "transformers.json").read_text())
    from PIL import Image

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    exe, pre = work / "mtmd_ref", work / "mtmd_preproc"
    build_tool("mtmd_ref", Path(args.llama_cpp), Path(args.llama_build), exe)
    build_tool("mtmd_preproc", Path(args.llama_cpp), Path(args.llama_build), pre)
    text_gguf, mmproj = fixtures / "smolvlm-tiny.gguf", fixtures / "mmproj-smolvlm-tiny.gguf"
    out = {"tool": "scripts/vlm_refs/mtmd_ref.cpp and mtmd_preproc.cpp on libmtmd (CPU build of "
                   "scripts/setup-llamacpp.sh)",
           "gguf": {p.name: sha256(p) for p in (text_gguf, mmproj)}, "images": {}}
    for name, entry in ref["images"].items():
        res = {"preprocess": mtmd_tiles_vs_transformers(pre, fixtures / entry["file"], entry, fixtures,
                                                        work / f"{name}_tiles")}
        if entry["format"] == "jpg":
            # the same again from PIL's decode, to separate decoding from resampling
            png = work / f"{name}_pil.png"
            Image.open(fixtures / entry["file"]).convert("RGB").save(png)
            res["preprocess_from_pil_decode"] = mtmd_tiles_vs_transformers(pre, png, entry, fixtures,
                                                                           work / f"{name}_tiles_pil")
        print(name, res["preprocess"], res.get("preprocess_from_pil_decode"), flush=True)
        for kind, pr in entry["prompts"].items():
            wd = Path(args.work) / f"{name}_{kind}"
            wd.mkdir(parents=True, exist_ok=True)
            (wd / "prompt.txt").write_text(pr["text"].replace("<image>", "<__media__>"))
            n_pred = n_greedy if (name == gen_image) else 0
            subprocess.run([str(exe), str(text_gguf), str(mmproj), str(fixtures / entry["file"]),
                            str(wd / "prompt.txt"), str(n_pred), str(wd)], check=True)
            mj = json.loads((wd / "mtmd.json").read_text())
            if kind == "chat":
                from PIL import Image

                pil = np.asarray(Image.open(fixtures / entry["file"]).convert("RGB")).astype(np.int16)
                stb = np.fromfile(wd / "mtmd_decoded.rgb", dtype=np.uint8).reshape(pil.shape).astype(np.int16)
                d = np.abs(pil - stb)
                decode = {"max_abs": int(d.max()), "frac_differing": float((d > 0).mean())}
            ids = []
            for c in mj["chunks"]:
                ids += c["tokens"] if c["type"] == "text" else [image_token_id] * c["n_tokens"]
            r = {"chunks": [{"type": c["type"], **({"tokens": c["tokens"]} if c["type"] == "text"
                                                  else {"n_tokens": c["n_tokens"]})} for c in mj["chunks"]],
                 "input_ids": ids, "ids_equal_transformers": ids == pr["input_ids"]}
            if not r["ids_equal_transformers"]:
                a, b = ids, pr["input_ids"]
                first = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
                r["first_difference"] = {"pos": first, "mtmd": a[first:first + 8], "transformers": b[first:first + 8],
                                         "len_mtmd": len(a), "len_transformers": len(b)}
            if kind == "chat":
                r["decode_vs_pil"] = decode
                # per-tile embeddings: mtmd's image chunks come in prompt order = tile order
                e_ref = np.fromfile(fixtures / entry["embeddings"]["file"], dtype="<f4").reshape(
                    entry["embeddings"]["shape"])
                imgs = [c for c in mj["chunks"] if c["type"] == "image"]
                e_m = np.stack([np.fromfile(wd / c["embd_file"], dtype="<f4").reshape(-1, mj["n_embd"])
                                for c in imgs])
                r["embd_max_rel_vs_transformers"] = float(np.abs(e_m - e_ref).max() / np.abs(e_ref).max())
                r["embd_per_tile_max_rel"] = [float(np.abs(e_m[k] - e_ref[k]).max() / np.abs(e_ref[k]).max())
                                              for k in range(len(imgs))]
            if n_pred:
                g = ref["generation"][kind]
                l_ref = np.fromfile(fixtures / g["last_logits_file"], dtype="<f4")
                l_m = np.fromfile(wd / "mtmd_last_logits.f32", dtype="<f4")
                r["last_logits_max_abs_vs_transformers"] = float(np.abs(l_m - l_ref).max())
                r["greedy"] = mj["greedy"]
                r["greedy_equal_transformers"] = mj["greedy"] == g["greedy_f32"]
            res[kind] = r
            print(name, kind, "ids equal" if r["ids_equal_transformers"] else "IDS DIFFER",
                  {k: v for k, v in r.items() if k.endswith("transformers") or k.startswith("embd_max")}, flush=True)
        out["images"][name] = res
    out["cli"] = run_mtmd_cli(Path(args.llama_build), text_gguf, mmproj, fixtures / ref["images"][gen_image]["file"],
                              ref["generation"]["chat_cli"]["greedy_text"], n_greedy)
    print("llama-mtmd-cli", out["cli"], flush=True)
    (fixtures / "mtmd.json").write_text(json.dumps(out, indent=1) + "\n")


def run_mtmd_cli(build: Path, text_gguf: Path, mmproj: Path, image: Path, expected: str, n_greedy: int) -> dict:
    """llama-mtmd-cli itself, greedy, one user turn: the prompt it formats and the text it prints."""
    user = "Can you describe this image?"
    cmd = [str(build / "bin" / "llama-mtmd-cli"), "-m", str(text_gguf), "--mmproj", str(mmproj), "--image",
           str(image), "-p", user, "-n", str(n_greedy), "--temp", "0", "-t", "2", "-v", "--no-warmup"]
    rc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    formatted = None
    lines = rc.stderr.splitlines()
    for i, line in enumerate(lines):
        if "formatted_chat.prompt: " in line:
            # the prompt runs on over the following log lines until the next timestamped one
            formatted = line.split("formatted_chat.prompt: ", 1)[1]
            for nxt in lines[i + 1:]:
                if nxt[:2] == "0." and " D " in nxt[:20]:
                    break
                formatted += "\n" + nxt
            break
    printed = rc.stdout.strip("\n")
    return {"command": "llama-mtmd-cli -m smolvlm-tiny.gguf --mmproj mmproj-smolvlm-tiny.gguf --image "
                       f"{image.name} -p {user!r} -n {n_greedy} --temp 0",
            "formatted_prompt": formatted, "printed": printed,
            "printed_equals_transformers_chat_cli_greedy_text": printed.strip() == expected.strip()}
