/*
 * edgettt's browser runner: generate text from an edgettt export with onnxruntime-web (WebAssembly).
 *
 *   import { Runner } from "./edgettt.mjs";
 *   const runner = await Runner.load(new URL("./", import.meta.url));   // the export folder
 *   for await (const piece of runner.generate("def main(", { maxNewTokens: 64 })) out.textContent += piece;
 *   runner.stats;   // promptTokens, newTokens, firstTokenMs, prefillMs, decodeTokensPerS, threads
 *
 * The JavaScript twin of edgettt/runner.py: everything comes from the folder's manifest.json (the
 * graphs, which input takes the token ids, which output is the logits, the state tensors, the
 * tokenizer); a fresh prompt is one prefill, every later token a decode step whose state tensors
 * come from the step before. Sampling is runner.py's `Sampling`: the repetition penalty over the last
 * 64 tokens, the cap on runs of one token, then greedy (temperature 0) or top-k, top-p, temperature.
 * A failure is a `WebRunnerError` whose message is one line for the page to show.
 */
import * as ort from "./ort.wasm.min.mjs";

export const RECENT_TOKENS = 64;  // the history the repetition penalty reads (state_file.RECENT_TOKENS)

export class WebRunnerError extends Error {
  constructor(message) { super(message); this.name = "WebRunnerError"; }
}

function fail(message) { throw new WebRunnerError(message); }

async function fetchFile(base, name, what) {
  const url = new URL(name, base);
  let response;
  try {
    response = await fetch(url);
  } catch (e) {
    fail(`${url}: cannot be fetched (${e.message}); serve the folder over http, e.g. python -m http.server`);
  }
  if (!response.ok) {
    fail(`${name}: ${what} is missing from the folder (HTTP ${response.status}); write it again with ` +
         "`edgettt export MODEL OUT --web`");
  }
  return response;
}

/* The bytes of a response, reporting (bytes read, bytes in all) as they arrive. */
async function readBytes(response, onProgress) {
  const total = Number(response.headers.get("Content-Length")) || 0;
  const reader = response.body.getReader();
  const parts = [];
  let read = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    parts.push(value);
    read += value.length;
    onProgress?.(read, total);
  }
  const bytes = new Uint8Array(read);
  let at = 0;
  for (const part of parts) { bytes.set(part, at); at += part.length; }
  return bytes;
}

/* The manifest fields this runner reads, checked as runner.py's check_manifest checks them. */
function checkManifest(m) {
  const bad = (what) => fail(`manifest.json: ${what}; export the model again with \`edgettt export\``);
  if (typeof m !== "object" || m === null || m.edgettt_export !== 1) bad("not an edgettt export manifest");
  if (!Number.isInteger(m.vocab_size) || m.vocab_size < 1) bad("vocab_size is missing or not a positive integer");
  if (!Number.isInteger(m.mini_batch_size) || m.mini_batch_size < 1) bad("mini_batch_size is missing");
  if (!["bytes", "tokenizer.json"].includes(m.tokenizer?.type)) bad("tokenizer is missing or of an unknown type");
  if (typeof m.web?.weights !== "string") bad("it names no weights file (web.weights): not written with --web");
  for (const kind of ["prefill", "decode"]) {
    const graph = m.graphs?.[kind];
    if (typeof graph?.file !== "string" || !Array.isArray(graph.inputs) || !Array.isArray(graph.outputs)) {
      bad(`graphs.${kind} must name a file, its inputs and outputs`);
    }
    if (!graph.inputs.some((x) => x.role === "input_ids")) bad(`graphs.${kind}.inputs has no input_ids`);
    if (graph.outputs.filter((x) => x.role === "logits").length !== 1) bad(`graphs.${kind} needs one logits output`);
  }
  if (!m.graphs.decode.inputs.some((x) => x.role === "position" || x.role === "inner_position")) {
    bad("graphs.decode.inputs has no position");
  }
}

/* ONNX Runtime's session config entries ("session.disable_quant_qdq": "1") as onnxruntime-web's `extra`. */
function extraOptions(config) {
  const extra = {};
  for (const [key, value] of Object.entries(config ?? {})) {
    const parts = key.split(".");
    let node = extra;
    for (const part of parts.slice(0, -1)) node = node[part] ??= {};
    node[parts.at(-1)] = value;
  }
  return extra;
}

const int64 = (values, dims) => new ort.Tensor("int64", BigInt64Array.from(values, BigInt), dims);

/* Token ids <-> text: byte-level (id = UTF-8 byte) or a tokenizer.json (the tokenizers library). */
class ByteTokenizer {
  encode(text) { return Array.from(new TextEncoder().encode(text)); }
  decodeStream() {
    const decoder = new TextDecoder("utf-8");
    return (ids, final = false) => decoder.decode(Uint8Array.from(ids.filter((i) => i >= 0 && i < 256)),
                                                  { stream: !final });
  }
}

class JsonTokenizer {
  constructor(tokenizer) { this.tokenizer = tokenizer; }
  encode(text) { return Array.from(this.tokenizer.encode(text, { add_special_tokens: false }).ids); }
  decodeStream() {  // the whole sequence decoded again, its new tail returned (as runner.py does)
    const seen = [];
    let shown = "";
    return (ids) => {
      seen.push(...ids);
      const text = this.tokenizer.decode(seen);
      const piece = text.slice(shown.length);
      shown = text;
      return piece;
    };
  }
}

async function loadTokenizer(base, manifest) {
  if (manifest.tokenizer.type === "bytes") return new ByteTokenizer();
  const { Tokenizer } = await import("./tokenizers.min.mjs");
  const json = await (await fetchFile(base, manifest.tokenizer.file, "the tokenizer")).json();
  return new JsonTokenizer(new Tokenizer(json, {}));
}

/* runner.py's Sampling: a seeded generator stands in for numpy's (the same seed gives other draws). */
export class Sampling {
  constructor({ temperature = 0, topK = 0, topP = 1, repetitionPenalty = 1.1, repeatLastN = RECENT_TOKENS,
                maxRun = null, seed = 0 } = {}) {
    Object.assign(this, { temperature, topK, topP, repetitionPenalty, repeatLastN });
    this.maxRun = maxRun ?? (repetitionPenalty > 1 ? 16 : 0);  // as `edgettt run` sets it
    this.state = (seed >>> 0) || 0x9e3779b9;
  }

  random() {  // xorshift32, in [0, 1)
    let x = this.state;
    x ^= x << 13; x ^= x >>> 17; x ^= x << 5;
    this.state = x >>> 0;
    return this.state / 2 ** 32;
  }

  pick(logits, history) {
    const z = Float64Array.from(logits);
    if (this.repetitionPenalty !== 1 && this.repeatLastN > 0) {
      for (const t of new Set(history.slice(-this.repeatLastN))) {
        z[t] = z[t] > 0 ? z[t] / this.repetitionPenalty : z[t] * this.repetitionPenalty;
      }
    }
    const run = history.slice(-this.maxRun);
    if (this.maxRun && run.length === this.maxRun && run.every((t) => t === run[0])) z[run[0]] = -Infinity;
    if (this.temperature <= 0) return argmax(z);
    if (this.topK > 0 && this.topK < z.length) {
      const kth = Float64Array.from(z).sort()[z.length - this.topK];
      z.forEach((v, i) => { if (v < kth) z[i] = -Infinity; });
    }
    const top = Math.max(...z);
    let p = z.map((v) => Math.exp((v - top) / this.temperature));
    const sum = p.reduce((a, b) => a + b, 0);
    p = p.map((v) => v / sum);
    if (this.topP < 1) {  // the smallest set whose mass reaches top_p
      const order = Array.from(p.keys()).sort((a, b) => p[b] - p[a]);
      let mass = 0;
      for (const i of order) { if (mass >= this.topP) p[i] = 0; else mass += p[i]; }
    }
    let u = this.random() * p.reduce((a, b) => a + b, 0);
    for (let i = 0; i < p.length; i++) { u -= p[i]; if (u < 0) return i; }
    return argmax(p);
  }
}

function argmax(values) {  // the first largest, as numpy's argmax
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

export class Runner {
  /* Load the export folder at `base` (a URL): manifest, tokenizer, weights (fetched once for both graphs),
     the prefill and decode sessions. `threads`: WebAssembly threads (more than 1 needs a cross-origin
     isolated page); `onProgress(text)`: what is loading. */
  static async load(base, { threads, onProgress } = {}) {
    base = new URL(base, globalThis.location?.href);
    const manifest = await (await fetchFile(base, "manifest.json", "manifest.json")).json()
      .catch(() => fail("manifest.json: not valid JSON; export the model again"));
    checkManifest(manifest);
    const tokenizer = await loadTokenizer(base, manifest);
    const graphs = {};
    for (const kind of ["prefill", "decode"]) {  // every file is fetched before any session is made
      graphs[kind] = await readBytes(await fetchFile(base, manifest.graphs[kind].file, `the ${kind} graph`));
    }
    const mb = (n) => (n / 1e6).toFixed(1);
    const weights = await readBytes(await fetchFile(base, manifest.web.weights, "the weights file"),
                                    (read, total) => onProgress?.(`weights ${mb(read)} of ${mb(total)} MB`));
    ort.env.logLevel = "error";
    ort.env.wasm.numThreads = threads ?? (globalThis.crossOriginIsolated ? Math.min(4, navigator.hardwareConcurrency) : 1);
    const options = { executionProviders: ["wasm"], externalData: [{ path: manifest.web.weights, data: weights }],
                      extra: extraOptions(manifest.session_config), freeDimensionOverrides: { batch: 1 } };
    const sessions = {};
    for (const kind of ["prefill", "decode"]) {
      onProgress?.(`${manifest.graphs[kind].file}: making the session`);
      try {
        sessions[kind] = await ort.InferenceSession.create(graphs[kind], options);
      } catch (e) {
        fail(`${manifest.graphs[kind].file}: onnxruntime-web ${ort.env.versions?.web ?? ""} cannot load it ` +
             `(${String(e.message ?? e).split("\n")[0]})`);
      }
    }
    return new Runner(manifest, tokenizer, sessions);
  }

  constructor(manifest, tokenizer, sessions) {
    this.manifest = manifest;
    this.tokenizer = tokenizer;
    this.sessions = sessions;
    this.current = null;  // {position, states, logits, recent}: the sequence read so far
    this.stats = {};
  }

  get threads() { return ort.env.wasm.numThreads; }

  reset() { this.current = null; }

  /* Append ids to the sequence: a prefill from a fresh state, decode steps after it. */
  async read(ids) {
    if (this.current === null) {
      const graph = this.manifest.graphs.prefill;
      const feeds = {};
      for (const x of graph.inputs) {
        if (x.role === "input_ids") feeds[x.name] = int64(ids, [1, ids.length]);
        else if (x.role === "logits_from") feeds[x.name] = int64([ids.length - 1], []);
      }
      const { logits, states } = this.split(graph, await this.sessions.prefill.run(feeds));
      this.current = { position: ids.length, states, logits: lastRow(logits), recent: ids.slice(-RECENT_TOKENS) };
      return;
    }
    for (const id of ids) await this.step(id);
  }

  async step(id) {
    const graph = this.manifest.graphs.decode;
    const { position, states, recent } = this.current;
    const feeds = {};
    for (const x of graph.inputs) {
      if (x.role === "input_ids") feeds[x.name] = int64([id], [1, 1]);
      else if (x.role === "position") feeds[x.name] = int64([position], []);
      else if (x.role === "inner_position") feeds[x.name] = int64([position % this.manifest.mini_batch_size], []);
      else if (x.role === "state") feeds[x.name] = states[x.state];
    }
    const out = this.split(graph, await this.sessions.decode.run(feeds));
    this.current = { position: position + 1, states: out.states, logits: lastRow(out.logits),
                     recent: [...recent, id].slice(-RECENT_TOKENS) };
  }

  split(graph, results) {
    const states = {};
    let logits = null;
    for (const x of graph.outputs) {
      if (x.role === "logits") logits = results[x.name];
      else if (x.role === "state") states[x.state] = results[x.name];
    }
    return { logits, states };
  }

  /* Yield text pieces as they decode, from a fresh state (or, with `resume`, after the sequence held).
     Options: maxNewTokens, temperature, topK, topP, repetitionPenalty, seed. Fills `this.stats`. */
  async *generate(prompt, { maxNewTokens = 64, resume = false, ...sampling } = {}) {
    if (typeof prompt !== "string") fail("the prompt is not text; give a string");
    if (!Number.isInteger(maxNewTokens) || maxNewTokens < 0) fail("max_new_tokens must be a whole number >= 0");
    const ids = prompt === "" ? [] : this.tokenizer.encode(prompt);
    if (!resume) this.reset();
    if (this.current === null && ids.length === 0) fail("the prompt is empty; give at least one character");
    const sampler = new Sampling(sampling);
    const push = this.tokenizer.decodeStream();
    const t0 = performance.now();
    if (ids.length) await this.read(ids);
    const t1 = performance.now();
    const generated = [];
    let firstTokenMs = null;
    for (let n = 0; n < maxNewTokens; n++) {
      const token = sampler.pick(this.current.logits, this.current.recent);
      generated.push(token);
      firstTokenMs ??= performance.now() - t0;
      yield push([token]);
      await this.step(token);
    }
    yield push([], true);  // the bytes of an unfinished character, as replacement characters
    const t2 = performance.now();
    this.stats = { promptTokens: ids.length, newTokens: generated.length, tokens: generated,
                   position: this.current.position, prefillMs: t1 - t0, firstTokenMs, decodeMs: t2 - t1,
                   decodeTokensPerS: generated.length / Math.max((t2 - t1) / 1000, 1e-9), threads: this.threads };
  }
}

function lastRow(logits) {  // logits [1, T, V] -> the last token's V values
  const vocab = logits.dims.at(-1);
  return logits.data.subarray(logits.data.length - vocab);
}
