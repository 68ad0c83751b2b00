"""Models in and out: Marian conversion (`conversion`), the CTranslate2 export (`export`), both proving their
result (`verification`); Hub folders and upload (`hub`) with their card (`model_card`); translation helpers
(`translation`), plots (`plots`) and model folders on disk (`folders`). Import the module you need: the optional
engines (ctranslate2, matplotlib) load only there."""
