"""The SQL92 selector grammar (lark, LALR) and the words its terminals stand for in errors.

Kept as a Python string so that the package needs no data file. Keywords are
case-insensitive and reserved (a property cannot be named `and`); property
names are case-sensitive. The lexer is lark's basic one, not the contextual
one, so that a keyword is a keyword wherever it appears.
"""
from __future__ import annotations

from functools import cache

from lark import Lark

GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)*
?and_expr: not_expr (_AND not_expr)*
?not_expr: _NOT not_expr                                      -> not_
         | predicate
?predicate: operand COMP_OP operand                           -> compare
          | operand _BETWEEN operand _AND operand             -> between
          | operand _NOT _BETWEEN operand _AND operand        -> not_between
          | operand _IN _LPAR literal (_COMMA literal)* _RPAR -> in_
          | operand _NOT _IN _LPAR literal (_COMMA literal)* _RPAR -> not_in
          | operand _IS NULL                                  -> is_null
          | operand _IS _NOT NULL                             -> is_not_null
          | operand _CONTAINS STRING                          -> contains
          | operand _NOT _CONTAINS STRING                     -> not_contains
          | operand _STARTSWITH STRING                        -> startswith
          | operand _NOT _STARTSWITH STRING                   -> not_startswith
          | operand _ENDSWITH STRING                          -> endswith
          | operand _NOT _ENDSWITH STRING                     -> not_endswith
          | _LPAR or_expr _RPAR
          | operand                                           -> truth
?operand: NAME | literal
?literal: NUMBER | STRING | TRUE | FALSE | NULL

COMP_OP: /<>|>=|<=|=|>|</
NUMBER: /-?[0-9]+(\.[0-9]+)?/
STRING: /'(?:[^']|'')*'/
NAME: /[A-Za-z_$][A-Za-z0-9_$.]*/
_AND: "AND"i
_OR: "OR"i
_NOT: "NOT"i
_BETWEEN: "BETWEEN"i
_IN: "IN"i
_IS: "IS"i
_CONTAINS: "CONTAINS"i
_STARTSWITH: "STARTSWITH"i
_ENDSWITH: "ENDSWITH"i
TRUE: "TRUE"i
FALSE: "FALSE"i
NULL: "NULL"i
_LPAR: "("
_RPAR: ")"
_COMMA: ","
%ignore /\s+/
"""

#: What each terminal is called in an error message ("expected a number or a property name").
TERMINAL_WORDS = {
    "NAME": "a property name",
    "NUMBER": "a number",
    "STRING": "a 'string'",
    "COMP_OP": "a comparison (= <> > >= < <=)",
    "TRUE": "TRUE",
    "FALSE": "FALSE",
    "NULL": "NULL",
    "_AND": "AND",
    "_OR": "OR",
    "_NOT": "NOT",
    "_BETWEEN": "BETWEEN",
    "_IN": "IN",
    "_IS": "IS",
    "_CONTAINS": "CONTAINS",
    "_STARTSWITH": "STARTSWITH",
    "_ENDSWITH": "ENDSWITH",
    "_LPAR": "'('",
    "_RPAR": "')'",
    "_COMMA": "','",
    "$END": "the end of the expression",
}

@cache
def parser() -> Lark:
    """The process's one parser, built on first use: building the LALR tables takes ~20 ms,
    which every `import ferry` would pay otherwise. A lark LALR parser is reusable."""
    return Lark(GRAMMAR, parser="lalr", lexer="basic", maybe_placeholders=False)


def words_for(terminals: set[str] | frozenset[str]) -> tuple[str, ...]:
    """The terminals a parser could have taken, in human words, sorted for stable messages."""
    return tuple(sorted({TERMINAL_WORDS.get(t, t) for t in terminals}))
