// Minimal Hardhat 2 config: used only to run a local JSON-RPC node for tests
// (`npx hardhat node --hostname 127.0.0.1 --port N`). Compilation is compile.js's job
// (npm solc, fixed settings), so Hardhat gets an empty sources folder and keeps its
// cache inside node_modules, never in the tree.
const path = require('path');

const scratch = path.join(__dirname, 'node_modules', '.cache', 'hardhat');

module.exports = {
  solidity: '0.8.30',
  paths: {
    sources: path.join(scratch, 'no-sources'),
    tests: path.join(scratch, 'no-tests'),
    cache: path.join(scratch, 'cache'),
    artifacts: path.join(scratch, 'artifacts'),
  },
  networks: {
    hardhat: {
      chainId: 31337,
      hardfork: 'cancun',
    },
  },
};
