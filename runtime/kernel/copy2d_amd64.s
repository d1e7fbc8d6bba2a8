//go:build amd64 && !purego

#include "textflag.h"

// func copy2DAVX2(dst *byte, dpitch int, src *byte, spitch, width, height int)
//
// A row of 32 bytes or more is moved in blocks of 128 bytes, then of 32,
// then one 32-byte move ending at the row's end, which may overlap bytes
// already moved (src and dst do not overlap, so it writes what they hold).
// A row of 16 to 31 bytes is two 16-byte moves, the second ending at the
// row's end.
TEXT ·copy2DAVX2(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ dpitch+8(FP), R8
	MOVQ src+16(FP), SI
	MOVQ spitch+24(FP), R9
	MOVQ width+32(FP), DX
	MOVQ height+40(FP), CX
	CMPQ DX, $32
	JB   short

	MOVQ DX, BX
	ANDQ $-128, BX     // bytes moved in 128-byte blocks
	LEAQ -32(DX), R10  // offset of the last 32-byte move

row:
	XORQ AX, AX
	TESTQ BX, BX
	JZ   by32

by128:
	VMOVDQU 0(SI)(AX*1), Y0
	VMOVDQU 32(SI)(AX*1), Y1
	VMOVDQU 64(SI)(AX*1), Y2
	VMOVDQU 96(SI)(AX*1), Y3
	VMOVDQU Y0, 0(DI)(AX*1)
	VMOVDQU Y1, 32(DI)(AX*1)
	VMOVDQU Y2, 64(DI)(AX*1)
	VMOVDQU Y3, 96(DI)(AX*1)
	ADDQ $128, AX
	CMPQ AX, BX
	JB   by128

by32:
	CMPQ AX, R10
	JA   tail
	VMOVDQU 0(SI)(AX*1), Y0
	VMOVDQU Y0, 0(DI)(AX*1)
	ADDQ $32, AX
	JMP  by32

tail:
	CMPQ AX, DX
	JEQ  next
	VMOVDQU 0(SI)(R10*1), Y0
	VMOVDQU Y0, 0(DI)(R10*1)

next:
	ADDQ R8, DI
	ADDQ R9, SI
	DECQ CX
	JNZ  row
	VZEROUPPER
	RET

short:
	LEAQ -16(DX), R10

shortrow:
	MOVOU 0(SI), X0
	MOVOU 0(SI)(R10*1), X1
	MOVOU X0, 0(DI)
	MOVOU X1, 0(DI)(R10*1)
	ADDQ R8, DI
	ADDQ R9, SI
	DECQ CX
	JNZ  shortrow
	RET

// func stream2DAVX2(dst *byte, dpitch int, src *byte, spitch, width, height int)
//
// Copy2D with non-temporal stores, for rows of a multiple of 32 bytes at
// 32-byte aligned destinations: blocks of 128 bytes, then of 32. No fence:
// see Fence. Where the source rows are apart, each row first prefetches the
// row 8 on (within the call): on a 20 MiB page whose source is read 256
// bytes every 2 KiB, that took the copy from 0.46-0.61 of copy() to 0.69-0.70
// (4 rows on: 0.61-0.70; 16: 0.59-0.60).
TEXT ·stream2DAVX2(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ dpitch+8(FP), R8
	MOVQ src+16(FP), SI
	MOVQ spitch+24(FP), R9
	MOVQ width+32(FP), DX
	MOVQ height+40(FP), CX
	MOVQ DX, BX
	ANDQ $-128, BX
	MOVQ R9, R11
	SHLQ $3, R11
	ADDQ SI, R11              // R11: the source of the row 8 rows on

srow:
	XORQ AX, AX
	CMPQ R9, DX
	JEQ  snopf                // one contiguous source: the hardware prefetches it
	CMPQ CX, $8
	JBE  snopf

spf:
	PREFETCHT0 0(R11)(AX*1)
	ADDQ $64, AX
	CMPQ AX, DX
	JB   spf
	XORQ AX, AX

snopf:
	TESTQ BX, BX
	JZ   s32

s128:
	VMOVDQU 0(SI)(AX*1), Y0
	VMOVDQU 32(SI)(AX*1), Y1
	VMOVDQU 64(SI)(AX*1), Y2
	VMOVDQU 96(SI)(AX*1), Y3
	VMOVNTDQ Y0, 0(DI)(AX*1)
	VMOVNTDQ Y1, 32(DI)(AX*1)
	VMOVNTDQ Y2, 64(DI)(AX*1)
	VMOVNTDQ Y3, 96(DI)(AX*1)
	ADDQ $128, AX
	CMPQ AX, BX
	JB   s128

s32:
	CMPQ AX, DX
	JAE  snext
	VMOVDQU 0(SI)(AX*1), Y0
	VMOVNTDQ Y0, 0(DI)(AX*1)
	ADDQ $32, AX
	JMP  s32

snext:
	ADDQ R8, DI
	ADDQ R9, SI
	ADDQ R9, R11
	DECQ CX
	JNZ  srow
	VZEROUPPER
	RET

// func Fence()
TEXT ·Fence(SB), NOSPLIT, $0-0
	SFENCE
	RET
