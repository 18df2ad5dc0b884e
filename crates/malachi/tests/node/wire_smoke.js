// A minimal client written from wire-protocol.md alone, in another language, run against a real
// `malachi serve`: auth, create_topic, produce, fetch with cursors and groups, commit,
// subscribe + stream_ack, errors. Exits non-zero with a message on the first surprise.
'use strict';
const net = require('net');
const tls = require('tls');
const fs = require('fs');
const assert = require('assert');

// With a sixth argument (a CA file), everything runs over TLS trusting that CA, as the
// original's Node clients do with their `tls` options; the broker must then refuse plain TCP.
const [host, port, user, password, caFile] = process.argv.slice(2);

function str(value) {
  if (value === null) return Buffer.from([0]);
  const bytes = Buffer.from(value, 'utf8');
  const head = Buffer.alloc(5);
  head[0] = 1;
  head.writeUInt32BE(bytes.length, 1);
  return Buffer.concat([head, bytes]);
}
function u8(v) { return Buffer.from([v]); }
function u32(v) { const b = Buffer.alloc(4); b.writeUInt32BE(v); return b; }
function u64(v) { const b = Buffer.alloc(8); b.writeBigUInt64BE(BigInt(v)); return b; }
function record(key, value, ts, headers) {
  const parts = [str(key), u32(Buffer.byteLength(value)), Buffer.from(value), u64(ts), u32(headers.length)];
  for (const [k, v] of headers) parts.push(str(k), str(v));
  return Buffer.concat(parts);
}

class Reader {
  constructor(buf) { this.buf = buf; this.at = 0; }
  u8() { return this.buf[this.at++]; }
  u16() { const v = this.buf.readUInt16BE(this.at); this.at += 2; return v; }
  u32() { const v = this.buf.readUInt32BE(this.at); this.at += 4; return v; }
  u64() { const v = this.buf.readBigUInt64BE(this.at); this.at += 8; return v; }
  str() {
    const flag = this.u8();
    if (flag === 0) return null;
    const len = this.u32();
    const s = this.buf.slice(this.at, this.at + len).toString('utf8');
    this.at += len;
    return s;
  }
  records() {
    const count = this.u32();
    const out = [];
    for (let i = 0; i < count; i++) {
      const key = this.str();
      const len = this.u32();
      const value = this.buf.slice(this.at, this.at + len).toString('utf8');
      this.at += len;
      const ts = this.u64();
      const headers = {};
      const hc = this.u32();
      for (let h = 0; h < hc; h++) { const k = this.str(); headers[k] = this.str(); }
      out.push({ key, value, ts, headers });
    }
    return out;
  }
  done() { assert.strictEqual(this.at, this.buf.length, 'trailing bytes in a response'); }
}

class Connection {
  constructor(socket) {
    this.socket = socket;
    this.buffer = Buffer.alloc(0);
    this.waiters = [];
    this.frames = [];
    this.closed = false;
    socket.on('data', (data) => { this.buffer = Buffer.concat([this.buffer, data]); this.pump(); });
    socket.on('close', () => { this.closed = true; this.pump(); });
  }
  pump() {
    while (this.buffer.length >= 4) {
      const len = this.buffer.readUInt32BE(0);
      if (this.buffer.length < 4 + len) break;
      const body = this.buffer.slice(4, 4 + len);
      this.buffer = this.buffer.slice(4 + len);
      this.frames.push({ corr: body.readUInt32BE(0), code: body.readUInt16BE(4), payload: body.slice(6) });
    }
    while (this.waiters.length && (this.frames.length || this.closed)) this.waiters.shift()(this.frames.shift());
  }
  next(timeoutMs = 10000) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no answer within ' + timeoutMs + ' ms')), timeoutMs);
      this.waiters.push((frame) => { clearTimeout(timer); resolve(frame); });
      this.pump();
    });
  }
  send(key, corr, payload) {
    const body = Buffer.concat([Buffer.alloc(6), payload]);
    body.writeUInt16BE(key, 0);
    body.writeUInt32BE(corr, 2);
    this.socket.write(Buffer.concat([u32(body.length), body]));
  }
  async call(key, corr, payload) {
    this.send(key, corr, payload);
    const frame = await this.next();
    assert.ok(frame, 'connection closed');
    assert.strictEqual(frame.corr, corr, 'answer on the request corr');
    return frame;
  }
}

function connect(plain = false) {
  return new Promise((resolve, reject) => {
    let socket;
    if (caFile && !plain) {
      const options = { host, port: Number(port), ca: fs.readFileSync(caFile), servername: 'localhost' };
      socket = tls.connect(options, () => resolve(new Connection(socket)));
    } else {
      socket = net.connect(Number(port), host, () => resolve(new Connection(socket)));
    }
    socket.on('error', reject);
  });
}

function errorReason(frame) {
  assert.notStrictEqual(frame.code, 0, 'expected an error');
  const r = new Reader(frame.payload);
  const reason = r.str();
  r.done();
  return reason;
}

async function login(name, pass) {
  const c = await connect();
  const frame = await c.call(0, 1, Buffer.concat([str(name), str(pass)]));
  return { c, frame };
}

async function main() {
  if (caFile) {
    const plain = await connect(true);
    plain.send(0, 1, Buffer.concat([str(user), str(password)]));
    const refused = await plain.next();
    assert.strictEqual(refused.corr, 0, 'a TLS-only broker answers plain TCP on corr 0');
    assert.strictEqual(errorReason(refused), 'tls_required');
  }
  const bad = await login(user, password + 'x');
  assert.strictEqual(errorReason(bad.frame), 'invalid_credentials');
  assert.strictEqual(await bad.c.next(), undefined, 'the server closes after a failed login');

  const { c, frame } = await login(user, password);
  assert.strictEqual(frame.code, 0);
  const token = new Reader(frame.payload).str();
  assert.ok(/^[A-Za-z0-9_-]{43}$/.test(token), 'a 43-character URL-safe token: ' + token);

  const topic = 'node-' + process.pid;
  assert.strictEqual((await c.call(1, 2, Buffer.concat([str(topic), u8(16)]))).code, 0);
  assert.strictEqual(errorReason(await c.call(1, 3, Buffer.concat([str(topic), u8(16)]))), 'already_exists');
  assert.strictEqual(errorReason(await c.call(1, 4, Buffer.concat([str('bad name!'), u8(8)]))), 'invalid_topic_name');

  const ts = 1767225600000;
  const produce = Buffer.concat([str(topic), u32(3),
    record('k1', 'v1', ts, [['x-seq', '1']]),
    record(null, 'v2', ts + 1, [['a', 'b'], ['c', '']]),
    record('k1', 'v3', ts + 2, [])]);
  const produced = await c.call(2, 5, produce);
  assert.strictEqual(produced.code, 0);
  assert.strictEqual(new Reader(produced.payload).u32(), 3);
  assert.strictEqual(errorReason(await c.call(2, 6, Buffer.concat([str('nope'), u32(0)]))), 'no_such_topic');

  const fetchReq = (cursor, group) =>
    Buffer.concat([str(topic), str(cursor), str(group), str(null), u32(100), u32(0)]);
  const page = await c.call(3, 7, fetchReq(null, null));
  assert.strictEqual(page.code, 0);
  let r = new Reader(page.payload);
  const records = r.records();
  const cursor = r.str();
  r.done();
  assert.deepStrictEqual(records.map((x) => x.value).sort(), ['v1', 'v2', 'v3']);
  const k1 = records.filter((x) => x.key === 'k1').map((x) => x.value);
  assert.deepStrictEqual(k1, ['v1', 'v3'], 'per-key order');
  const first = records.find((x) => x.value === 'v1');
  assert.strictEqual(first.ts, BigInt(ts));
  assert.deepStrictEqual(first.headers, { 'x-seq': '1' });
  assert.deepStrictEqual(records.find((x) => x.value === 'v2').headers, { a: 'b', c: '' });
  assert.ok(/^[A-Za-z0-9_-]+$/.test(cursor), 'an ASCII cursor');

  r = new Reader((await c.call(3, 8, fetchReq(cursor, null))).payload);
  assert.strictEqual(r.records().length, 0, 'the cursor continues after the last record');
  assert.strictEqual(errorReason(await c.call(3, 9, fetchReq('g3QAAAAA', null))), 'invalid_cursor');

  assert.strictEqual((await c.call(4, 10, Buffer.concat([str(topic), str('g1'), str(cursor)]))).code, 0);
  r = new Reader((await c.call(3, 11, fetchReq(null, 'g1'))).payload);
  assert.strictEqual(r.records().length, 0, 'the group resumes after its commit');

  c.send(99, 12, Buffer.alloc(0));
  assert.strictEqual(errorReason(await c.next()), 'unknown_api_key');

  // Subscribe: no answer on success, then pushes on the subscribe's corr.
  const s = (await login(user, password)).c;
  s.send(5, 20, Buffer.concat([str(topic), str('live'), str(null), u32(2), u32(50)]));
  const push = await s.next();
  assert.strictEqual(push.corr, 20);
  r = new Reader(push.payload);
  const pushed = r.records();
  const pushCursor = r.str();
  r.done();
  assert.strictEqual(pushed.length, 2, 'a push stays within the window');
  s.send(7, 21, Buffer.concat([str(topic), str('live'), str('m')]));
  const unexpected = await s.next();
  assert.strictEqual(unexpected.corr, 21);
  assert.strictEqual(errorReason(unexpected), 'unexpected_frame');
  s.send(6, 22, Buffer.concat([str(topic), str('live'), str(null), str(pushCursor), u32(2)]));
  const second = await s.next();
  assert.strictEqual(second.corr, 20);
  assert.strictEqual(new Reader(second.payload).records().length, 1, 'credit returned by the ack');

  // Oversize frame: answered with corr 0, then closed.
  c.socket.write(u32(16777217));
  const tooLarge = await c.next();
  assert.strictEqual(tooLarge.corr, 0);
  assert.strictEqual(errorReason(tooLarge), 'frame_too_large');
  c.socket.destroy();
  s.socket.destroy();
  console.log('node wire smoke: ok');
}

main().catch((error) => { console.error('node wire smoke failed:', error.message); process.exit(1); });
