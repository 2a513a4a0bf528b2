// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.20;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

/// @notice Malicious 6-decimal token: when armed, every transfer calls back into `target`
/// with `payload` (from the token's own address) before moving the balance. The outcome
/// of the re-entrant call is recorded, not bubbled, so a test can see that the callee
/// refused it while the outer call went on (or set `bubble` to revert the whole call).
contract ReentrantUSD is ERC20 {
    address public target;
    bytes public payload;
    bool public armed;
    bool public bubble;

    bool public reentryAttempted;
    bool public reentrySucceeded;
    bytes public reentryReturnData;

    constructor() ERC20("Reentrant USD", "rUSD") {}

    function decimals() public pure override returns (uint8) {
        return 6;
    }

    function mint(address to, uint256 amount) external {
        _mint(to, amount);
    }

    function arm(address target_, bytes calldata payload_, bool bubble_) external {
        target = target_;
        payload = payload_;
        bubble = bubble_;
        armed = true;
    }

    /// Lets the token itself act as a settlement participant (e.g. a provider withdrawing).
    function call(address to, bytes calldata data) external returns (bytes memory) {
        (bool ok, bytes memory ret) = to.call(data);
        if (!ok) {
            assembly {
                revert(add(ret, 32), mload(ret))
            }
        }
        return ret;
    }

    /// Approve `spender` to move the token's own balance (for deposits made by the token).
    function approveFromSelf(address spender, uint256 amount) external {
        _approve(address(this), spender, amount);
    }

    function _update(address from, address to, uint256 value) internal override {
        if (armed && from != address(0) && to != address(0)) {
            armed = false; // one shot
            reentryAttempted = true;
            (bool ok, bytes memory ret) = target.call(payload);
            reentrySucceeded = ok;
            reentryReturnData = ret;
            if (!ok && bubble) {
                assembly {
                    revert(add(ret, 32), mload(ret))
                }
            }
        }
        super._update(from, to, value);
    }
}
