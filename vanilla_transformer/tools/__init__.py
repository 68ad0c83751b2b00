"""Models in and out, each module named for what it talks to: `marian` (conversion from OPUS-MT checkpoints),
`ctranslate2` and `onnx` (the exports and their engines), all proving their result (`verification`) and sharing
`engines` (the optional packages and the export record); `translation` (one translation loop for every engine),
`hub` (Hub folders and upload) with their card (`model_card`), `plots`, and model folders on disk (`folders`).
Import the module you need: the optional engines (ctranslate2, onnxruntime, matplotlib) load only there."""
