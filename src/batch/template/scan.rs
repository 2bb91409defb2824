//! The scan of a template before it is compiled: minijinja works out
//! expressions of constants as it compiles (it folds them), before its
//! fuel counts, so a value of constants made too big (`[1]*10**8 == …`)
//! would cost its work with no bound. The scan walks the template's tree
//! and adds up the size of every value whose size is known (constants,
//! literals, a list or text repeated a known number of times); a template
//! past [`MAX_RENDER_STEPS`] is refused before it is compiled ([`too_big`]).

use super::MAX_RENDER_STEPS;

/// What the scan of a template before it is compiled knows of a value an
/// expression makes: its size (bytes of text, items of a list, 1 else) and
/// number, where they are known.
#[derive(Clone, Copy)]
struct Made {
    size: u64,
    number: Option<f64>,
    list: bool,
    /// Made of constants alone: minijinja works it out as it compiles (it
    /// folds constants), before any fuel counts.
    constant: bool,
}

/// The work a template's values of known size take: a constant, once for
/// each constant expression it is part of (minijinja folds each again);
/// a list repeated a known number of times, once.
struct Scan {
    work: u64,
}

impl Scan {
    fn statements(&mut self, statements: &[minijinja::machinery::ast::Stmt<'_>]) {
        statements.iter().for_each(|statement| self.statement(statement));
    }

    fn statement(&mut self, statement: &minijinja::machinery::ast::Stmt<'_>) {
        use minijinja::machinery::ast::Stmt;
        match statement {
            Stmt::Template(t) => self.statements(&t.children),
            Stmt::EmitExpr(e) => self.top(&e.expr),
            Stmt::EmitRaw(_) => {}
            Stmt::ForLoop(f) => {
                self.top(&f.target);
                self.top(&f.iter);
                f.filter_expr.iter().for_each(|e| self.top(e));
                self.statements(&f.body);
                self.statements(&f.else_body);
            }
            Stmt::IfCond(i) => {
                self.top(&i.expr);
                self.statements(&i.true_body);
                self.statements(&i.false_body);
            }
            Stmt::WithBlock(w) => {
                for (target, value) in &w.assignments {
                    self.top(target);
                    self.top(value);
                }
                self.statements(&w.body);
            }
            Stmt::Set(s) => {
                self.top(&s.target);
                self.top(&s.expr);
            }
            Stmt::SetBlock(s) => {
                self.top(&s.target);
                s.filter.iter().for_each(|e| self.top(e));
                self.statements(&s.body);
            }
            Stmt::AutoEscape(a) => {
                self.top(&a.enabled);
                self.statements(&a.body);
            }
            Stmt::FilterBlock(f) => {
                self.top(&f.filter);
                self.statements(&f.body);
            }
            Stmt::Do(d) => {
                self.top(&d.call.expr);
                self.arguments(&d.call.args);
            }
        }
    }

    fn arguments(&mut self, arguments: &[minijinja::machinery::ast::CallArg<'_>]) {
        use minijinja::machinery::ast::CallArg;
        for argument in arguments {
            match argument {
                CallArg::Pos(e) | CallArg::Kwarg(_, e) | CallArg::PosSplat(e) | CallArg::KwargSplat(e) => self.top(e),
            }
        }
    }

    /// An expression not folded with the one around it.
    fn top(&mut self, expression: &minijinja::machinery::ast::Expr<'_>) {
        self.expression(expression, 0);
    }

    /// What `expression` makes, if it is known; `folds` is how many
    /// constant expressions around it minijinja folds it again with.
    fn expression(&mut self, expression: &minijinja::machinery::ast::Expr<'_>, folds: u64) -> Option<Made> {
        use minijinja::machinery::ast::{BinOpKind, Expr, UnaryOpKind};
        let made = match expression {
            Expr::Const(c) => Some(Made {
                size: c.value.as_str().map_or(1, |text| text.len() as u64),
                number: f64::try_from(c.value.clone()).ok(),
                list: false,
                constant: true,
            }),
            Expr::List(l) => Some(self.items(&l.items, true)),
            Expr::Tuple(t) => Some(self.items(&t.items, true)),
            Expr::Map(m) => {
                let keys = self.items(&m.keys, false);
                let values = self.items(&m.values, false);
                Some(Made {
                    size: keys.size.saturating_add(values.size),
                    constant: keys.constant && values.constant,
                    ..keys
                })
            }
            Expr::UnaryOp(u) => self.expression(&u.expr, folds + 1).map(|made| Made {
                size: 1,
                number: made.number.filter(|_| matches!(u.op, UnaryOpKind::Neg)).map(|n| -n),
                list: false,
                constant: made.constant,
            }),
            Expr::BinOp(b) => {
                let left = self.expression(&b.left, folds + 1);
                let right = self.expression(&b.right, folds + 1);
                let (Some(left), Some(right)) = (left, right) else {
                    return self.charged(None, folds);
                };
                let number = |f: fn(f64, f64) -> f64| left.number.zip(right.number).map(|(l, r)| f(l, r));
                let constant = left.constant && right.constant;
                let made = |size: u64, number: Option<f64>, list: bool| Made { size, number, list, constant };
                Some(match b.op {
                    BinOpKind::Mul => {
                        // A list or text repeated: a count that is no known
                        // number (a constant one) is taken as the most.
                        let repeated = |what: Made, count: Made| {
                            let times = match count.number {
                                Some(n) if n.is_finite() => n.max(0.0) as u64,
                                _ if count.constant => u64::MAX,
                                _ => 1,
                            };
                            made(what.size.saturating_mul(times), None, what.list)
                        };
                        match (left.list || left.number.is_none(), right.list || right.number.is_none()) {
                            (true, _) => repeated(left, right),
                            (false, true) => repeated(right, left),
                            (false, false) => made(1, number(|l, r| l * r), false),
                        }
                    }
                    BinOpKind::Add => match left.number.zip(right.number) {
                        Some((l, r)) => made(1, Some(l + r), false),
                        None => made(left.size.saturating_add(right.size), None, left.list || right.list),
                    },
                    BinOpKind::Concat => made(left.size.saturating_add(right.size), None, false),
                    BinOpKind::Sub => made(1, number(|l, r| l - r), false),
                    BinOpKind::Div => made(1, number(|l, r| l / r), false),
                    BinOpKind::FloorDiv => made(1, number(|l, r| (l / r).floor()), false),
                    BinOpKind::Rem => made(1, number(|l, r| l % r), false),
                    BinOpKind::Pow => made(1, number(f64::powf), false),
                    BinOpKind::ScAnd | BinOpKind::ScOr => {
                        made(left.size.max(right.size), None, left.list || right.list)
                    }
                    _ => made(1, None, false),
                })
            }
            Expr::Compare(c) => {
                let mut constant = self.expression(&c.expr, folds + 1).is_some_and(|made| made.constant);
                for op in &c.ops {
                    constant &= self.expression(&op.expr, folds + 1).is_some_and(|made| made.constant);
                }
                Some(Made { size: 1, number: None, list: false, constant })
            }
            // Not folded: what is in it is folded on its own.
            Expr::Var(_) => None,
            Expr::Slice(s) => {
                self.top(&s.expr);
                [&s.start, &s.stop, &s.step].into_iter().flatten().for_each(|e| self.top(e));
                None
            }
            Expr::IfExpr(i) => {
                self.top(&i.test_expr);
                self.top(&i.true_expr);
                i.false_expr.iter().for_each(|e| self.top(e));
                None
            }
            Expr::Filter(f) => {
                f.expr.iter().for_each(|e| self.top(e));
                self.arguments(&f.args);
                None
            }
            Expr::Test(t) => {
                self.top(&t.expr);
                self.arguments(&t.args);
                None
            }
            Expr::GetAttr(g) => {
                self.top(&g.expr);
                None
            }
            Expr::GetItem(g) => {
                self.top(&g.expr);
                self.top(&g.subscript_expr);
                None
            }
            Expr::Call(c) => {
                self.top(&c.expr);
                self.arguments(&c.args);
                None
            }
        };
        self.charged(made, folds)
    }

    /// A list's (or a map's) items, each folded on its own.
    fn items(&mut self, items: &[minijinja::machinery::ast::Expr<'_>], list: bool) -> Made {
        let mut made = Made { size: 1, number: None, list, constant: true };
        for item in items {
            let size = self.expression(item, 0).map_or(1, |item| item.size);
            made.size = made.size.saturating_add(size);
            made.constant &= matches!(item, minijinja::machinery::ast::Expr::Const(_));
        }
        made
    }

    /// `made`, its work counted: a constant's once per fold, a list of a
    /// known size once.
    fn charged(&mut self, made: Option<Made>, folds: u64) -> Option<Made> {
        if let Some(made) = made {
            let times = match made.constant {
                true => folds + 1,
                false => u64::from(made.list),
            };
            self.work = self.work.saturating_add(made.size.saturating_mul(times));
        }
        made
    }
}

/// Why a template (or a `for_each` expression, `expression`) cannot be
/// rendered within its steps whatever it renders over: a value it makes of
/// constants, or a list it repeats a known number of times, is too big.
/// minijinja works out constants as it compiles, before its fuel counts,
/// so they are measured here, before that. `None` when it is not a
/// template (compiling it says why) or is within its steps.
pub(super) fn too_big(source: &str, expression: bool) -> Option<String> {
    use minijinja::machinery::{parse, parse_expr};
    let mut scan = Scan { work: 0 };
    match expression {
        true => scan.top(&parse_expr(source).ok()?),
        false => scan.statement(&parse(source, "<template>", Default::default()).ok()?),
    }
    (scan.work > MAX_RENDER_STEPS).then(|| {
        format!(
            "it would take more than the {MAX_RENDER_STEPS} steps a template may take (a value made too big: a \
             list or text repeated too many times)"
        )
    })
}
