#!/usr/bin/env node
// Compile the settlement contract and its test tokens with the npm `solc` package (solcjs)
// through standard JSON, with fixed optimizer settings and EVM version, and write one
// artifact per contract (ABI + bytecode) to build/.
//
//   node compile.js            write build/*.json
//   node compile.js --check    compile in memory; exit 1 if build/ differs (bytecode or ABI)
//   node compile.js --out DIR  write the artifacts to DIR instead of build/
'use strict';

const fs = require('fs');
const path = require('path');
const solc = require('solc');

const HERE = __dirname;
const SOURCES = [
  'Settlement.sol',
  'test/MockUSD.sol',
  'test/FeeOnTransferUSD.sol',
  'test/ReentrantUSD.sol',
  'test/Mock18.sol',
];
// Fixed: changing any of these changes the bytecode, which the committed artifacts pin.
const SETTINGS = {
  optimizer: { enabled: true, runs: 200 },
  evmVersion: 'cancun',
  viaIR: false,
  metadata: { bytecodeHash: 'ipfs', useLiteralContent: false },
  outputSelection: {
    '*': { '*': ['abi', 'evm.bytecode.object', 'evm.deployedBytecode.object'] },
  },
};
const EXPECTED_SOLC = require('./package.json').devDependencies.solc;

function findImport(importPath) {
  const candidates = [path.join(HERE, importPath), path.join(HERE, 'node_modules', importPath)];
  for (const file of candidates) {
    if (fs.existsSync(file)) return { contents: fs.readFileSync(file, 'utf8') };
  }
  return { error: `import not found: ${importPath}` };
}

function compile() {
  const version = solc.version();
  if (!version.startsWith(EXPECTED_SOLC + '+')) {
    throw new Error(`solc ${version} is not the pinned ${EXPECTED_SOLC}; run npm ci`);
  }
  const sources = {};
  for (const name of SOURCES) {
    sources[name] = { content: fs.readFileSync(path.join(HERE, name), 'utf8') };
  }
  const input = { language: 'Solidity', sources, settings: SETTINGS };
  const output = JSON.parse(solc.compile(JSON.stringify(input), { import: findImport }));
  const errors = (output.errors || []).filter((e) => e.severity === 'error');
  for (const e of output.errors || []) process.stderr.write(e.formattedMessage + '\n');
  if (errors.length) throw new Error(`${errors.length} compilation error(s)`);

  const artifacts = {};
  for (const sourceName of SOURCES) {
    for (const [contractName, c] of Object.entries(output.contracts[sourceName] || {})) {
      artifacts[contractName] = {
        contractName,
        sourceName,
        compiler: { name: 'solc', version, settings: { ...SETTINGS, outputSelection: undefined } },
        abi: c.abi,
        bytecode: '0x' + c.evm.bytecode.object,
        deployedBytecode: '0x' + c.evm.deployedBytecode.object,
      };
    }
  }
  return artifacts;
}

function serialize(artifact) {
  return JSON.stringify(artifact, null, 2) + '\n';
}

function main(argv) {
  const check = argv.includes('--check');
  const outIdx = argv.indexOf('--out');
  const outDir = outIdx >= 0 ? path.resolve(argv[outIdx + 1]) : path.join(HERE, 'build');
  const artifacts = compile();

  if (check) {
    const problems = [];
    for (const [name, a] of Object.entries(artifacts)) {
      const file = path.join(outDir, `${name}.json`);
      if (!fs.existsSync(file)) {
        problems.push(`${name}: ${path.relative(process.cwd(), file)} missing`);
        continue;
      }
      const committed = JSON.parse(fs.readFileSync(file, 'utf8'));
      for (const key of ['bytecode', 'deployedBytecode']) {
        if (committed[key] !== a[key]) problems.push(`${name}: ${key} differs from a fresh compile`);
      }
      if (JSON.stringify(committed.abi) !== JSON.stringify(a.abi)) {
        problems.push(`${name}: abi differs from a fresh compile`);
      }
    }
    if (problems.length) {
      process.stderr.write(problems.join('\n') + '\nrun `npm run build` in contracts/\n');
      process.exit(1);
    }
    process.stdout.write(`ok: ${Object.keys(artifacts).length} artifacts match (solc ${solc.version()})\n`);
    return;
  }

  fs.mkdirSync(outDir, { recursive: true });
  for (const [name, a] of Object.entries(artifacts)) {
    fs.writeFileSync(path.join(outDir, `${name}.json`), serialize(a));
  }
  process.stdout.write(`wrote ${Object.keys(artifacts).length} artifacts to ${outDir}\n`);
}

main(process.argv.slice(2));
