"""COMPARISON CODE, not part of normserve: sentence-transformers behind FastAPI, as a tutorial writes it.

`SentenceTransformer(path).encode(texts)` in a sync route (FastAPI runs it in its thread pool), torch at one
thread, the OpenAI embeddings shape in and out. The benchmark starts it as
`python -m benchmarks.peers.st_fastapi --model PATH --port N`.
"""

from __future__ import annotations

import argparse
import sys

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer


class EmbeddingsRequest(BaseModel):
    input: list[str]
    model: str = ""


def create_app(model_path: str) -> FastAPI:
    torch.set_num_threads(1)
    model = SentenceTransformer(model_path, device="cpu", local_files_only=True)
    app = FastAPI(title="sentence-transformers (comparison peer)")

    @app.get("/health")
    def health() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/v1/embeddings")
    def embeddings(req: EmbeddingsRequest) -> dict[str, object]:
        vectors = model.encode(req.input, batch_size=32)
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": req.model}

    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    uvicorn.run(create_app(args.model), host="127.0.0.1", port=args.port, workers=1, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
