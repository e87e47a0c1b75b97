// `rvm dap` driven by DebugClient from @vscode/debugadapter-testsupport, the test client
// of VS Code's own debug adapters. tests/test_dap.py runs this file under node with:
//   RVM_BIN   the `rvm` command (the adapter is started as `rvm dap`)
//   RVM_ROOT  the repository (for the example programs)
//   RVM_TMP   a scratch directory
// It prints one line per scenario and closes with "N passed, N failed".
'use strict';

const assert = require('assert');
const fs = require('fs');
const path = require('path');
const { DebugClient } = require('@vscode/debugadapter-testsupport');

const ROOT = process.env.RVM_ROOT || path.join(__dirname, '..', '..');
const RVM = process.env.RVM_BIN || 'rvm';
const TMP = process.env.RVM_TMP || fs.mkdtempSync('/tmp/rvm-dap-');
const FIB_JA = path.join(ROOT, 'examples', 'janus', 'fib.ja');
const POLY = path.join(ROOT, 'asm', 'poly.rasm');

function client() {
  const dc = new DebugClient(RVM, 'dap', 'rvm', { cwd: ROOT }, true);
  dc.defaultTimeout = 20000;
  return dc;
}

async function topFrame(dc) {
  const r = await dc.stackTraceRequest({ threadId: 1 });
  return r.body.stackFrames[0];
}

async function evaluate(dc, expression, context) {
  const r = await dc.evaluateRequest({ expression, frameId: 1, context });
  return r.body.result;
}

async function scopeVariables(dc, name) {
  const scopes = (await dc.scopesRequest({ frameId: 1 })).body.scopes;
  const scope = scopes.find((s) => s.name === name);
  assert.ok(scope, `no scope ${name} in ${scopes.map((s) => s.name)}`);
  const vars = (await dc.variablesRequest({ variablesReference: scope.variablesReference }))
    .body.variables;
  return Object.fromEntries(vars.map((v) => [v.name, v]));
}

// launch with breakpoints set between `initialized` and configurationDone, as VS Code does
async function launchAndStop(dc, args, reason, lines) {
  const stopped = dc.waitForEvent('stopped');
  await Promise.all([
    dc.waitForEvent('initialized').then(async () => {
      if (lines) {
        const r = await dc.setBreakpointsRequest({
          source: { path: args.program }, breakpoints: lines.map((line) => ({ line })) });
        r.body.breakpoints.forEach((b) => assert.ok(b.verified, JSON.stringify(b)));
      }
      return dc.configurationDoneRequest();
    }),
    dc.launch(args),
  ]);
  const ev = await stopped;
  assert.strictEqual(ev.body.reason, reason);
  return ev;
}

async function step(dc, request, args, reason) {
  const stopped = dc.waitForEvent('stopped');
  await dc[request](Object.assign({ threadId: 1 }, args));
  const ev = await stopped;
  if (reason) assert.strictEqual(ev.body.reason, reason);
  return ev;
}

const scenarios = {
  'initialize announces step back and the breakpoint kinds': async (dc) => {
    const r = await dc.initializeRequest();
    for (const cap of ['supportsStepBack', 'supportsConfigurationDoneRequest',
      'supportsFunctionBreakpoints', 'supportsConditionalBreakpoints',
      'supportsHitConditionalBreakpoints', 'supportsDataBreakpoints',
      'supportsEvaluateForHovers', 'supportsRestartRequest', 'supportsTerminateRequest',
      'supportsSteppingGranularity']) {
      assert.strictEqual(r.body[cap], true, cap);
    }
  },

  'unknown requests are refused': async (dc) => {
    await dc.initializeRequest();
    await assert.rejects(dc.send('illegalRequest'), /unknown request/);
  },

  'hits a breakpoint in Janus source (hitBreakpoint)': async (dc) => {
    await dc.hitBreakpoint({ program: FIB_JA }, { path: FIB_JA, line: 10 });
    const v = await scopeVariables(dc, 'Arguments');
    assert.deepStrictEqual([v.x1.value, v.x2.value, v.n.value], ['1', '1', '0']);
  },

  'steps both ways and reverse-continues to a breakpoint behind': async (dc) => {
    await launchAndStop(dc, { program: FIB_JA }, 'breakpoint', [10]);
    await step(dc, 'nextRequest', {}, 'step');
    assert.strictEqual((await topFrame(dc)).line, 11);
    await step(dc, 'stepBackRequest', {}, 'breakpoint');
    assert.strictEqual((await topFrame(dc)).line, 10);
    await step(dc, 'continueRequest', {}, 'breakpoint');          // one frame up
    assert.strictEqual((await dc.stackTraceRequest({ threadId: 1 })).body.totalFrames, 4);
    const ev = await step(dc, 'reverseContinueRequest', {}, 'breakpoint');
    assert.deepStrictEqual(ev.body.hitBreakpointIds, [1]);
    assert.strictEqual((await dc.stackTraceRequest({ threadId: 1 })).body.totalFrames, 5);
    await step(dc, 'reverseContinueRequest', {}, 'start');
    assert.strictEqual(await evaluate(dc, 'x1 + x2 + n'), '0');
  },

  'a data breakpoint is hit backwards': async (dc) => {
    await launchAndStop(dc, { program: FIB_JA }, 'end');
    const info = await dc.dataBreakpointInfoRequest({ name: 'x2' });
    assert.strictEqual(info.body.dataId, 'x2');
    const r = await dc.setDataBreakpointsRequest({ breakpoints: [{ dataId: info.body.dataId }] });
    assert.ok(r.body.breakpoints[0].verified);
    const ev = await step(dc, 'reverseContinueRequest', {}, 'data breakpoint');
    assert.match(ev.body.description, /x2/);
    assert.strictEqual(await evaluate(dc, 'x2'), '5');
  },

  'program output and the end': async (dc) => {
    const out = dc.assertOutput('stdout', 'x1 = 5, x2 = 8\n');
    await launchAndStop(dc, { program: FIB_JA }, 'end');
    await out;
    const exited = dc.waitForEvent('exited');
    const terminated = dc.waitForEvent('terminated');
    await dc.continueRequest({ threadId: 1 });       // continue at the end: the program exits
    assert.strictEqual((await exited).body.exitCode, 0);
    await terminated;
  },

  'gradients flow back in gradient mode (Python source)': async (dc) => {
    const src = path.join(TMP, 'square.py');
    fs.writeFileSync(src, 'import rvm\n\n\n@rvm.reversible\ndef square(out: float, x: float):\n' +
      '    out += 3.0 * x * x\n');
    await launchAndStop(dc, { program: src, entry: 'square', args: ['0.0', '2.0'],
      gradient: { loss: 'out' } }, 'entry');
    assert.strictEqual((await topFrame(dc)).source.path, src);
    await step(dc, 'reverseContinueRequest', {}, 'start');
    const g = await scopeVariables(dc, 'Gradients');
    assert.strictEqual(g.x.value, '12.0');
    assert.strictEqual(await evaluate(dc, 'grad[x] / x', 'watch'), '6.0');
    assert.strictEqual(await evaluate(dc, 'x', 'hover'), '2.0');
  },

  'instruction granularity, registers and stepping out (assembly)': async (dc) => {
    await launchAndStop(dc, { program: POLY, entry: 'f', args: ['0.0', '1.0', '3.0'],
      stopOnEntry: true }, 'entry');
    await step(dc, 'stepInRequest', { granularity: 'instruction' }, 'step');
    assert.strictEqual((await topFrame(dc)).name, 'inner');
    const regs = await scopeVariables(dc, 'Registers');
    assert.strictEqual(regs.f2.value, '3.0');
    await step(dc, 'stepOutRequest', {}, 'step');
    assert.strictEqual((await topFrame(dc)).name, 'f');
    await step(dc, 'stepBackRequest', { granularity: 'instruction' }, 'step');
    assert.strictEqual((await topFrame(dc)).name, 'inner');
  },

  'an invertibility failure stops with its message': async (dc) => {
    const bad = path.join(TMP, 'bad.rasm');
    fs.writeFileSync(bad, '.func f(r0)\nb: BR.EQ r0, 0, c\n INC r0\nc: CF.EQ r0, 0, b\n.end\n');
    const ev = await launchAndStop(dc, { program: bad, args: ['-1'] }, 'exception');
    assert.match(ev.body.text, /InvertibilityError/);
    const info = await dc.exceptionInfoRequest({ threadId: 1 });
    assert.strictEqual(info.body.exceptionId, 'InvertibilityError');
  },

  'bad launch arguments are refused with the reason': async (dc) => {
    await dc.initializeRequest();
    await assert.rejects(dc.launchRequest({ program: 'no-such-file.ja' }), /no such file/);
    await assert.rejects(dc.launchRequest({ program: FIB_JA, engine: 'warp' }),
      /'engine' must be one of/);
  },
};

async function main() {
  let passed = 0;
  let failed = 0;
  for (const [name, run] of Object.entries(scenarios)) {
    const dc = client();
    try {
      await dc.start();
      await run(dc);
      console.log(`ok ${name}`);
      passed += 1;
    } catch (err) {
      console.log(`FAILED ${name}: ${err && err.stack ? err.stack : err}`);
      failed += 1;
    } finally {
      await dc.stop();
    }
  }
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

main();
