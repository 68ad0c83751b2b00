"""Models in and out, each module named for what it talks to: `marian` (conversion from OPUS-MT checkpoints),
`ctranslate2` and `onnx` (the exports and their engines), all proving their result (`verification`) and sharing
`exports` (the optional packages, the export record, the scripts' command line); `translation` (one translation loop
for every engine) and `engines` (an engine by name), `hub` (Hub folders and upload) with their card (`model_card`),
`plots`, model folders on disk (`folders`), text as sentences (`sentences`) and the translation server on Ray Serve
(`serving`).
Import the module you need: the optional engines (ctranslate2, onnxruntime, matplotlib) load only there."""
