"""Operators and what flows between them: blocks, marks, and every step of a lane's chain.

They do no I/O of their own except through the storage clients a stage hands them; the
pipeline package runs them (:mod:`zephon.pipeline.steps`).

| module | owns |
| --- | --- |
| ``batch`` | batch: a lane's samples grouped into batches, collated into columns |
| ``block`` | Blocks: what flows between stages |
| ``chat`` | tokenize_chat: conversations rendered with a chat template, tokenized |
| ``decode`` | decode: fetched bytes become samples |
| ``fetch`` | fetch: a lane's range requests become bytes, many in flight |
| ``group`` | batch(per_dataset=True): every batch from one dataset, per lane |
| ``image`` | image steps: resize, crop, flip and channel order of decoded images |
| ``imagedecode`` | image decoding: encoded bytes to uint8 arrays, bounded by the header |
| ``imagelimits`` | bounds on what an image's header may declare, checked before decoding |
| ``itemops`` | Item operators: map, filter and tokenize |
| ``jpeg`` | JPEG through Zephon's own binding of libjpeg-turbo (``zephon._jpeg``) |
| ``marks`` | Marks: where an item leaves its lane, which is what a checkpoint stores per lane |
| ``merge`` | merge: a rank's lanes interleaved item by item, round-robin, into one stream |
| ``mixture`` | ensure_mixture: a filtered lane stream brought back to the curriculum's weights |
| ``objects`` | fetch_field: samples that name another object |
| ``operator`` | Operators: each step of a pipeline's chain is one small typed object |
| ``pack`` | pack: token sequences into rows of exactly ``seq_len`` tokens, per lane |
| ``shuffle`` | shuffle: a lane's items permuted within consecutive windows of ``buffer_size`` |
| ``tensor`` | to_tensor: a decoded image as a model takes it (layout, dtype, normalisation) |
| ``tokenize`` | tokenize: text to token ids |
| ``training`` | to_training: token rows or batches made ready for a causal language model's loss |
| ``transform`` | map, filter and apply: user functions over a lane's samples, block by block |
| ``windows`` | Windows of a lane's items: what shuffle and the fit packers share |
"""
