// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.20;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

/// @notice An 18-decimal token: Settlement must refuse it at deployment (its units would not
/// be micro-USD).
contract Mock18 is ERC20 {
    constructor() ERC20("Eighteen", "E18") {}
}
