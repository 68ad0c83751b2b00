// transformers.js translating with an ONNX export of a vanilla_transformer model, from a local folder (no Hub):
//
//     node scripts/transformers_js/translate.mjs EXPORT_DIR SENTENCES.txt [--dtype fp32|q8] [--max_new_tokens N]
//
// One JSON string per input line on stdout: the pipeline's translation_text. Sentences go one per call, since
// transformers.js 4.3 keeps decoding the finished rows of a batch until every row has ended.
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { env, pipeline } from '@huggingface/transformers';

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { dtype: { type: 'string', default: 'fp32' }, max_new_tokens: { type: 'string', default: '256' } },
});
if (positionals.length !== 2) {
  console.error('usage: node translate.mjs EXPORT_DIR SENTENCES.txt [--dtype fp32|q8] [--max_new_tokens N]');
  process.exit(2);
}
const [modelDir, inputFile] = positionals;
env.allowRemoteModels = false;
const translator = await pipeline('translation', path.resolve(modelDir), { dtype: values.dtype });
const lines = fs.readFileSync(inputFile, 'utf8').split('\n');
if (lines.at(-1) === '') lines.pop();
for (const line of lines) {
  const [output] = await translator(line, { max_new_tokens: Number(values.max_new_tokens) });
  console.log(JSON.stringify(output.translation_text));
}
