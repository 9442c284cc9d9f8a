"""meta-pytorch/torchrec#2598: semi-synchronous pipeline, CUDA illegal memory access and NaNs at high memory use.

Embeddings are looked up in advance on an embedding stream and consumed on
the main stream, which waits for the lookup: ordered, but with no lifetime
statement.  When the batch's context drops the embeddings, their blocks go
back to the embedding stream's pool, and the next batch's lookup there
overwrites them while the main stream's forward may still be reading.  The
fix calls ``record_stream`` for tensors allocated in one stream and used in
another.
"""
import torch

from npu_lifetime.corpus.case import Case, main

CASE = Case(
    name="torchrec_semi_sync_embeddings",
    threads=("meta-pytorch/torchrec#2598",),
    summary="embeddings looked up on the embedding stream, read on the main stream, dropped unrecorded",
    finding="uncovered_free",
    producer="embedding_stream", consumer="default", buffer="embeddings",
    devices=("sim", "cuda"),  # the stand-in CANN runtime has no index_select kernel
)

ROWS, DIM, BATCHES = 1024, 64, 3


def program(dev, form):
    M = dev.module
    embedding_stream = M.Stream()
    table = torch.randn(ROWS, DIM, device=dev.type)
    all_ids = [torch.arange(batch, ROWS, 2, device=dev.type) for batch in range(BATCHES)]
    embedding_stream.wait_stream(M.current_stream())  # the table and the ids are ready; from here on the
    pooled_all = []                                   # lookups run ahead, in parallel with the main stream
    for batch in range(BATCHES):
        ids = all_ids[batch]
        with M.stream(embedding_stream):
            embeddings = table.index_select(0, ids)  # fetched in advance, in parallel with backward
        M.current_stream().wait_stream(embedding_stream)
        dev.slow()  # the main stream is still busy with the previous batch
        pooled = embeddings.sum(0)  # the forward reads them on the main stream
        if form == "upstream":
            dev.record_stream(embeddings, M.current_stream())
        elif form == "record_use":
            import npu_lifetime

            npu_lifetime.record_use(embeddings, M.current_stream())
        del embeddings  # the context is freed as early as possible
        pooled_all.append(pooled)
    M.current_stream().wait_stream(embedding_stream)
    return all(bool(torch.allclose(pooled, table.index_select(0, ids).sum(0)))
               for pooled, ids in zip(pooled_all, all_ids))


if __name__ == "__main__":
    main(CASE, program)
