// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.20;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {Ownable2Step} from "@openzeppelin/contracts/access/Ownable2Step.sol";
import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {IERC20Metadata} from "@openzeppelin/contracts/token/ERC20/extensions/IERC20Metadata.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";

/// @title gpumarket on-chain settlement
/// @notice Buyers escrow a 6-decimal USD stablecoin; the operator settles each lease once,
/// moving its cost out of the buyer's escrow and crediting provider and platform with the
/// ledger's integer split; provider and platform withdraw their credits (pull payments).
///
/// Units: every amount is in token base units, which for a 6-decimal USD stablecoin are
/// exactly the ledger's micro-USD (DESIGN.md, "Units").
///
/// Split (identical to settlement/split.py):
///     platformFee = cost * takeRateBps / 10000   (floor)
///     provider    = cost - platformFee           (rounding dust to the provider)
///
/// Reclaim when the operator disappears: a buyer calls requestReclaim(); if no lease is
/// settled against that buyer's escrow for reclaimDelay seconds, the buyer may reclaim()
/// the whole unused escrow. Any settlement against the buyer cancels a pending request
/// (the operator is evidently alive and the escrow may still be owed for running leases);
/// an operator who is alive returns unused escrow with refund() instead.
contract Settlement is Ownable2Step, ReentrancyGuard {
    using SafeERC20 for IERC20;

    uint256 public constant BPS_DENOMINATOR = 10_000;
    uint8 public constant TOKEN_DECIMALS = 6;
    uint256 public constant MIN_RECLAIM_DELAY = 1 hours;
    uint256 public constant MAX_RECLAIM_DELAY = 365 days;

    /// One lease settlement in a batch.
    struct LeaseCharge {
        bytes32 leaseId;
        address buyer;
        address provider;
        uint256 cost; // micro-USD (token base units)
    }

    IERC20 public immutable token;
    uint256 public immutable takeRateBps;
    address public immutable platform;
    uint256 public immutable reclaimDelay; // seconds

    address public operator;

    /// buyer => unused escrow (micro-USD)
    mapping(address => uint256) public escrowOf;
    /// payee (provider or platform) => withdrawable credit (micro-USD)
    mapping(address => uint256) public creditOf;
    /// lease id => settled (a lease id settles once)
    mapping(bytes32 => bool) public settled;
    /// buyer => time of a pending reclaim request (0: none)
    mapping(address => uint256) public reclaimRequestedAt;
    /// sum of all escrow and all credits: what the contract owes (micro-USD)
    uint256 public totalOwed;

    event OperatorChanged(address indexed previousOperator, address indexed newOperator);
    event Deposited(address indexed buyer, address indexed payer, uint256 amount, uint256 escrowAfter);
    event LeaseSettled(
        bytes32 indexed leaseId,
        address indexed buyer,
        address indexed provider,
        uint256 cost,
        uint256 providerAmount,
        uint256 platformFee
    );
    event Withdrawn(address indexed payee, address indexed to, uint256 amount);
    event Refunded(address indexed buyer, uint256 amount, uint256 escrowAfter);
    event ReclaimRequested(address indexed buyer, uint256 escrow, uint256 availableAt);
    event ReclaimCancelled(address indexed buyer, bytes32 indexed leaseId);
    event Reclaimed(address indexed buyer, uint256 amount);

    error TakeRateTooHigh(uint256 takeRateBps);
    error WrongTokenDecimals(uint8 decimals);
    error ZeroAddress();
    error ReclaimDelayOutOfRange(uint256 reclaimDelay);
    error NotOperator(address caller);
    error ZeroAmount();
    error FeeOnTransferRefused(uint256 sent, uint256 received);
    error AlreadySettled(bytes32 leaseId);
    error InsufficientEscrow(address buyer, uint256 escrow, uint256 needed);
    error NothingToWithdraw(address payee);
    error NoReclaimRequested(address buyer);
    error ReclaimNotYetAvailable(address buyer, uint256 availableAt);
    error EmptyBatch();

    modifier onlyOperator() {
        if (msg.sender != operator) revert NotOperator(msg.sender);
        _;
    }

    /// @param token_ the 6-decimal USD stablecoin
    /// @param takeRateBps_ platform take rate in basis points, 0..10000 (gpumarket: 1500)
    /// @param platform_ the platform's payee address (withdraws the platform fees)
    /// @param operator_ the key that settles leases
    /// @param reclaimDelay_ seconds a buyer waits, with no settlement against it, to reclaim
    constructor(
        IERC20 token_,
        uint256 takeRateBps_,
        address platform_,
        address operator_,
        uint256 reclaimDelay_
    ) Ownable(msg.sender) {
        if (takeRateBps_ > BPS_DENOMINATOR) revert TakeRateTooHigh(takeRateBps_);
        if (address(token_) == address(0) || platform_ == address(0) || operator_ == address(0)) {
            revert ZeroAddress();
        }
        uint8 decimals = IERC20Metadata(address(token_)).decimals();
        if (decimals != TOKEN_DECIMALS) revert WrongTokenDecimals(decimals);
        if (reclaimDelay_ < MIN_RECLAIM_DELAY || reclaimDelay_ > MAX_RECLAIM_DELAY) {
            revert ReclaimDelayOutOfRange(reclaimDelay_);
        }
        token = token_;
        takeRateBps = takeRateBps_;
        platform = platform_;
        reclaimDelay = reclaimDelay_;
        operator = operator_;
        emit OperatorChanged(address(0), operator_);
    }

    // ----------------------------------------------------------------- views

    /// @notice The split of `cost`: (platformFee, providerAmount), as settlement/split.py.
    function splitOf(uint256 cost) public view returns (uint256 platformFee, uint256 providerAmount) {
        platformFee = (cost * takeRateBps) / BPS_DENOMINATOR;
        providerAmount = cost - platformFee;
    }

    // ----------------------------------------------------------------- owner

    function setOperator(address newOperator) external onlyOwner {
        if (newOperator == address(0)) revert ZeroAddress();
        emit OperatorChanged(operator, newOperator);
        operator = newOperator;
    }

    // ----------------------------------------------------------------- buyers

    /// @notice Escrow `amount` micro-USD for msg.sender (needs a prior token approval).
    function deposit(uint256 amount) external nonReentrant {
        _deposit(msg.sender, amount);
    }

    /// @notice Escrow `amount` micro-USD for `buyer`, paid by msg.sender.
    function depositFor(address buyer, uint256 amount) external nonReentrant {
        if (buyer == address(0)) revert ZeroAddress();
        _deposit(buyer, amount);
    }

    /// @notice Start the reclaim clock: after reclaimDelay seconds with no settlement
    /// against msg.sender, reclaim() returns the whole unused escrow.
    function requestReclaim() external nonReentrant {
        uint256 availableAt = block.timestamp + reclaimDelay;
        reclaimRequestedAt[msg.sender] = block.timestamp;
        emit ReclaimRequested(msg.sender, escrowOf[msg.sender], availableAt);
    }

    /// @notice Take back the whole unused escrow once a reclaim request has aged.
    function reclaim() external nonReentrant {
        uint256 requestedAt = reclaimRequestedAt[msg.sender];
        if (requestedAt == 0) revert NoReclaimRequested(msg.sender);
        uint256 availableAt = requestedAt + reclaimDelay;
        if (block.timestamp < availableAt) revert ReclaimNotYetAvailable(msg.sender, availableAt);
        uint256 amount = escrowOf[msg.sender];
        if (amount == 0) revert NothingToWithdraw(msg.sender);
        reclaimRequestedAt[msg.sender] = 0;
        escrowOf[msg.sender] = 0;
        totalOwed -= amount;
        emit Reclaimed(msg.sender, amount);
        token.safeTransfer(msg.sender, amount);
    }

    // ----------------------------------------------------------------- operator

    /// @notice Settle one lease: `cost` micro-USD out of `buyer`'s escrow, split between
    /// `provider` and the platform. Reverts if `leaseId` was settled before.
    function settle(bytes32 leaseId, address buyer, address provider, uint256 cost)
        external
        onlyOperator
        nonReentrant
    {
        uint256 platformFee = _settle(leaseId, buyer, provider, cost);
        if (platformFee != 0) creditOf[platform] += platformFee;
    }

    /// @notice Settle many leases in one transaction; all or nothing.
    function settleBatch(LeaseCharge[] calldata charges) external onlyOperator nonReentrant {
        uint256 n = charges.length;
        if (n == 0) revert EmptyBatch();
        uint256 platformTotal;
        for (uint256 i; i < n; ++i) {
            LeaseCharge calldata c = charges[i];
            platformTotal += _settle(c.leaseId, c.buyer, c.provider, c.cost);
        }
        if (platformTotal != 0) creditOf[platform] += platformTotal;
    }

    /// @notice Return `amount` of `buyer`'s unused escrow to the buyer (a live operator's
    /// way of releasing what no lease will charge).
    function refund(address buyer, uint256 amount) external onlyOperator nonReentrant {
        if (amount == 0) revert ZeroAmount();
        uint256 escrow = escrowOf[buyer];
        if (escrow < amount) revert InsufficientEscrow(buyer, escrow, amount);
        unchecked {
            escrowOf[buyer] = escrow - amount;
        }
        totalOwed -= amount;
        emit Refunded(buyer, amount, escrow - amount);
        token.safeTransfer(buyer, amount);
    }

    // ----------------------------------------------------------------- payees

    /// @notice Withdraw msg.sender's whole credit (provider earnings or platform fees).
    function withdraw() external nonReentrant {
        _withdraw(msg.sender);
    }

    /// @notice Withdraw msg.sender's whole credit to another address.
    function withdrawTo(address to) external nonReentrant {
        if (to == address(0)) revert ZeroAddress();
        _withdraw(to);
    }

    // ----------------------------------------------------------------- internals

    function _deposit(address buyer, uint256 amount) private {
        if (amount == 0) revert ZeroAmount();
        uint256 before = token.balanceOf(address(this));
        token.safeTransferFrom(msg.sender, address(this), amount);
        uint256 received = token.balanceOf(address(this)) - before;
        if (received != amount) revert FeeOnTransferRefused(amount, received);
        uint256 escrowAfter = escrowOf[buyer] + amount;
        escrowOf[buyer] = escrowAfter;
        totalOwed += amount;
        emit Deposited(buyer, msg.sender, amount, escrowAfter);
    }

    /// Moves one lease's cost from escrow to the provider's credit; returns the platform fee,
    /// which the caller credits (once per batch).
    function _settle(bytes32 leaseId, address buyer, address provider, uint256 cost)
        private
        returns (uint256 platformFee)
    {
        if (settled[leaseId]) revert AlreadySettled(leaseId);
        if (buyer == address(0) || provider == address(0)) revert ZeroAddress();
        uint256 escrow = escrowOf[buyer];
        if (escrow < cost) revert InsufficientEscrow(buyer, escrow, cost);
        settled[leaseId] = true;
        uint256 providerAmount;
        (platformFee, providerAmount) = splitOf(cost);
        unchecked {
            escrowOf[buyer] = escrow - cost;
        }
        if (providerAmount != 0) creditOf[provider] += providerAmount;
        if (reclaimRequestedAt[buyer] != 0) {
            reclaimRequestedAt[buyer] = 0;
            emit ReclaimCancelled(buyer, leaseId);
        }
        emit LeaseSettled(leaseId, buyer, provider, cost, providerAmount, platformFee);
    }

    function _withdraw(address to) private {
        uint256 amount = creditOf[msg.sender];
        if (amount == 0) revert NothingToWithdraw(msg.sender);
        creditOf[msg.sender] = 0;
        totalOwed -= amount;
        emit Withdrawn(msg.sender, to, amount);
        token.safeTransfer(to, amount);
    }
}
